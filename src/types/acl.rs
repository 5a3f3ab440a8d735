//! ZooKeeper's ACL grammar: `scheme:id:perms` entries as its CLI writes them. On the ground floor
//! because config checks them against its credentials and `zk/` hands them to the client crate.

/// ZooKeeper's permission bits.
pub mod acl_perms {
    pub const READ: u8 = 1;
    pub const WRITE: u8 = 2;
    pub const CREATE: u8 = 4;
    pub const DELETE: u8 = 8;
    pub const ADMIN: u8 = 16;
}

/// One entry of `zookeeper.acl`: who (`scheme:id`) may do what (`perms`, ZooKeeper's bits).
/// Parsed once, when the configuration is read; written back as `scheme:id:perms`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct AclEntry {
    pub scheme: String,
    pub id: String,
    pub perms: u8,
}

impl AclEntry {
    /// Parses `scheme:id:perms` as ZooKeeper's CLI writes it, e.g. `world:anyone:r`,
    /// `digest:app:Nz4n…=:cdrwa`, `ip:10.0.0.0/8:r`, `auth::cdrwa`.
    pub fn parse(text: &str) -> Result<AclEntry, String> {
        let shape = "an entry scheme:id:perms, like world:anyone:r, auth::cdrwa or digest:app:<hash>:cdrwa";
        let (scheme, rest) = text.split_once(':').ok_or_else(|| shape.to_owned())?;
        let (id, letters) = rest.rsplit_once(':').ok_or_else(|| shape.to_owned())?;
        let mut perms = 0u8;
        for letter in letters.chars() {
            let bit = match letter {
                'r' => acl_perms::READ,
                'w' => acl_perms::WRITE,
                'c' => acl_perms::CREATE,
                'd' => acl_perms::DELETE,
                'a' => acl_perms::ADMIN,
                other => return Err(format!("unknown permission {other:?}: permissions are letters of cdrwa")),
            };
            if perms & bit != 0 {
                return Err(format!("permission {letter:?} given twice"));
            }
            perms |= bit;
        }
        if perms == 0 {
            return Err("no permissions: give letters of cdrwa".to_owned());
        }
        match scheme {
            "world" if id != "anyone" => return Err("the world scheme has the one id `anyone`".to_owned()),
            "auth" if !id.is_empty() => {
                return Err(
                    "the auth scheme takes no id (write auth::cdrwa): it means zkq's own credentials".to_owned()
                );
            },
            "digest" => {
                use base64::Engine;
                let valid = id.split_once(':').is_some_and(|(user, hash)| {
                    !user.is_empty()
                        && base64::engine::general_purpose::STANDARD.decode(hash).is_ok_and(|sha1| sha1.len() == 20)
                });
                if !valid {
                    return Err(
                        "a digest id is user:base64(sha1(\"user:password\")), 28 characters after the user".to_owned()
                    );
                }
            },
            "ip" => {
                let (addr, bits) = match id.split_once('/') {
                    Some((addr, bits)) => (addr, Some(bits)),
                    None => (id, None),
                };
                let max = match addr.parse::<std::net::IpAddr>() {
                    Ok(std::net::IpAddr::V4(_)) => 32,
                    Ok(std::net::IpAddr::V6(_)) => 128,
                    Err(_) => return Err("an ip id is an address or address/bits, like 10.0.0.0/8".to_owned()),
                };
                if bits.is_some_and(|b| !b.parse::<u8>().is_ok_and(|b| b <= max)) {
                    return Err(format!("the prefix length of an ip id is 0 to {max}"));
                }
            },
            "sasl" | "x509" if id.is_empty() => return Err(format!("the {scheme} scheme needs an id")),
            "world" | "auth" | "sasl" | "x509" => {},
            other => {
                return Err(format!("unknown scheme {other:?}: zkq knows world, auth, digest, ip, sasl and x509"));
            },
        }
        Ok(AclEntry { scheme: scheme.to_owned(), id: id.to_owned(), perms })
    }
}

impl TryFrom<String> for AclEntry {
    type Error = String;

    fn try_from(text: String) -> Result<AclEntry, String> {
        AclEntry::parse(&text)
    }
}

impl std::fmt::Display for AclEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}:", self.scheme, self.id)?;
        for (bit, letter) in [
            (acl_perms::CREATE, 'c'),
            (acl_perms::DELETE, 'd'),
            (acl_perms::READ, 'r'),
            (acl_perms::WRITE, 'w'),
            (acl_perms::ADMIN, 'a'),
        ] {
            if self.perms & bit != 0 {
                write!(f, "{letter}")?;
            }
        }
        Ok(())
    }
}

impl From<AclEntry> for String {
    fn from(entry: AclEntry) -> String {
        entry.to_string()
    }
}

/// The ACL zkq gives the nodes it creates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeAcl {
    /// `world:anyone:cdrwa`: no credentials are configured.
    Open,
    /// `auth::cdrwa`: sessions with the same credentials as zkq's.
    CreatorAll,
    /// `zookeeper.acl`, as configured.
    List(Vec<AclEntry>),
}

/// The id ZooKeeper's digest scheme derives from `user:password`: `user:base64(sha1(user:password))`'s hash part.
pub(crate) fn digest_hash(credentials: &str) -> String {
    use base64::Engine;
    let sha1 = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY, credentials.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(sha1.as_ref())
}
