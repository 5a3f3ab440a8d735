//! The OpenAPI document, built from the handlers' annotations (the committed `openapi/openapi.json`
//! is checked against it by a test).

use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::state::AppState;
use super::wire::API_TOKEN_HEADER;
use super::{batch, counters, error, leases, queues, redrive};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "zkq",
        description = "Durable, Curator-compatible ZooKeeper queues over HTTP. Every error is JSON {code, message}.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    tags(
        (name = "queues", description = "Put, take, peek and remove messages"),
        (name = "leases", description = "Lock-path safe consumption: lease, ack, nack, extend"),
        (name = "counters", description = "Shared counters compatible with Curator's SharedCount"),
    ),
    components(schemas(error::ErrorBody)),
)]
struct ApiDoc;

pub(super) fn api_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(queues::list_queues))
        .routes(routes!(queues::get_queue, queues::delete_queue))
        .routes(routes!(queues::put_message, queues::peek_messages, queues::remove_by_id))
        .routes(routes!(batch::put_batch))
        .routes(routes!(batch::ack_batch))
        .routes(routes!(queues::remove_message))
        .routes(routes!(queues::purge_queue))
        .routes(routes!(redrive::start_redrive, redrive::list_redrives, redrive::cancel_redrive))
        .routes(routes!(queues::take_message))
        .routes(routes!(leases::lease_message))
        .routes(routes!(leases::ack))
        .routes(routes!(leases::nack))
        .routes(routes!(leases::extend))
        .routes(routes!(counters::get_counter, counters::set_counter))
        .routes(routes!(counters::add_to_counter))
}

/// The OpenAPI document the API listener serves (and `openapi/openapi.json` holds).
pub fn openapi_document() -> utoipa::openapi::OpenApi {
    let mut openapi = api_routes().into_openapi();
    document_access_control(&mut openapi);
    openapi
}

/// The API token as a security scheme (optional: required only when `api.token_file` is set),
/// and the 401 and 403 answers of [`super::guard`] on every operation.
pub(super) fn document_access_control(openapi: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::security::{ApiKey, ApiKeyValue, SecurityRequirement, SecurityScheme};
    use utoipa::openapi::{Content, Ref, Response};
    openapi.components.get_or_insert_with(Default::default).add_security_scheme(
        "api_token",
        SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
            API_TOKEN_HEADER,
            "The token of api.token_file; required only when zkq is configured with one",
        ))),
    );
    openapi.security =
        Some(vec![SecurityRequirement::new("api_token", Vec::<String>::new()), SecurityRequirement::default()]);
    let error = |description: &str| {
        let mut response = Response::new(description);
        response
            .content
            .insert("application/json".to_owned(), Content::new(Some(Ref::from_schema_name("ErrorBody"))).into());
        response
    };
    for item in openapi.paths.paths.values_mut() {
        for operation in
            [&mut item.get, &mut item.put, &mut item.post, &mut item.delete, &mut item.patch].into_iter().flatten()
        {
            let responses = &mut operation.responses.responses;
            responses.entry("401".to_owned()).or_insert_with(|| {
                error("`unauthorized`: zkq has an API token (api.token_file) and the request's zkq-api-token header is missing or wrong").into()
            });
            responses.entry("403".to_owned()).or_insert_with(|| {
                error("`cross_origin_refused`: a web browser sent the request for a page of another origin").into()
            });
        }
    }
}

/// The document as committed: pretty JSON with a trailing newline.
pub fn openapi_json() -> String {
    let mut text = openapi_document().to_pretty_json().unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    text.push('\n');
    text
}
