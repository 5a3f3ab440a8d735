//! The test tiers. Plain `cargo test` runs the unit tier: the library's and binary's own tests,
//! which need neither ZooKeeper nor a JVM. The integration tier (`tests/it`: real ZooKeeper
//! servers, the Curator jars, kazoo) is built only with the `integration` feature, which
//! `scripts/test.sh` enables after installing what it needs.

/// `scripts/test.sh` sets `ZKQ_INTEGRATION=1` together with the feature; if the variable is set
/// without the feature, the integration tier would be skipped in silence: fail instead.
#[cfg(not(feature = "integration"))]
#[test]
fn the_integration_tier_is_never_skipped_when_it_was_asked_for() {
    assert!(
        std::env::var_os("ZKQ_INTEGRATION").is_none(),
        "ZKQ_INTEGRATION is set but the `integration` feature is not: the integration tests would not run"
    );
    eprintln!(
        "integration tests (tests/it) skipped: run ./scripts/test.sh, which installs ZooKeeper, Curator and kazoo"
    );
}
