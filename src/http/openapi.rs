//! The OpenAPI document, built from the handlers' annotations (the committed `openapi/openapi.json`
//! is checked against it by a test).

use utoipa::Number;
use utoipa::OpenApi;
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{AdditionalProperties, Object, Schema, SchemaType, Type};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::DURATION_PATTERN;
use super::queues::MAX_PEEK_LIMIT;
use super::state::AppState;
use super::{batch, counters, error, leases, queues, redrive};
use crate::config::Config;
use crate::web::headers::API_TOKEN_HEADER;

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
    components(schemas(error::ErrorBody, batch::BatchFormat)),
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

/// The OpenAPI document the API listener of a zkq with this configuration serves
/// (`openapi/openapi.json` holds the default configuration's).
pub(crate) fn openapi_document(config: &Config) -> utoipa::openapi::OpenApi {
    let mut openapi = api_routes().into_openapi();
    document_access_control(&mut openapi);
    document_bounds(&mut openapi, config);
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

/// The document as served and committed: pretty JSON with a trailing newline.
pub fn openapi_json(config: &Config) -> String {
    let mut text = openapi_document(config).to_pretty_json().unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    text.push('\n');
    text
}

/// A bound a handler checks, as the document states it.
#[derive(Debug, Clone)]
enum Bound {
    /// `minLength`, `maxLength` and `pattern` of a string.
    Text { min: usize, max: usize, pattern: String },
    /// `minimum` and (when there is one) `maximum` of an integer.
    Range { min: i64, max: Option<i64> },
    /// `minItems` and `maxItems` of an array.
    Items { min: usize, max: usize },
    /// A string that must not be `null` when given.
    NotNull,
}

/// Every bound the handlers check on a value a client sends, each taken from the constant or the
/// configuration value the check uses, so a client generated from the document (or a contract
/// fuzzer) sends nothing that the document calls valid and the server refuses with 400: parameters
/// by name (they mean the same wherever they appear), then fields of the request bodies.
pub(super) fn document_bounds(openapi: &mut utoipa::openapi::OpenApi, config: &Config) {
    use crate::queue::{MAX_ID_LEN, MAX_IDEMPOTENCY_KEY_LEN, id_pattern, idempotency_key_pattern};
    use crate::types::{MAX_NAME_LEN, MAX_TRACEPARENT_LEN, Traceparent, name_pattern};

    let max_batch = config.api.max_batch;
    let name = Bound::Text { min: 1, max: MAX_NAME_LEN, pattern: name_pattern() };
    let id = Bound::Text { min: 1, max: MAX_ID_LEN, pattern: id_pattern() };
    let duration = Bound::Text { min: 1, max: usize::MAX, pattern: DURATION_PATTERN.to_owned() };
    let key = Bound::Text { min: 1, max: MAX_IDEMPOTENCY_KEY_LEN, pattern: idempotency_key_pattern() };
    let traceparent = Bound::Text { min: 1, max: MAX_TRACEPARENT_LEN, pattern: Traceparent::pattern() };
    let batch = Bound::Range { min: 1, max: i64::try_from(max_batch).ok() };
    let parameters: [(&str, &Bound); 11] = [
        ("queue", &name),
        ("name", &name),
        ("id", &id),
        ("group", &id),
        ("wait", &duration),
        ("delay", &duration),
        ("visibility", &duration),
        ("max", &batch),
        ("limit", &Bound::Range { min: 1, max: Some(MAX_PEEK_LIMIT) }),
        ("Idempotency-Key", &key),
        ("traceparent", &traceparent),
    ];
    for item in openapi.paths.paths.values_mut() {
        let operations =
            [&mut item.get, &mut item.put, &mut item.post, &mut item.delete, &mut item.patch].into_iter().flatten();
        for parameter in operations.flat_map(|operation| operation.parameters.iter_mut().flatten()) {
            let RefOr::T(parameter) = parameter else { continue };
            let bound = parameters.iter().find(|(name, _)| parameter.name == *name).map(|(_, bound)| *bound);
            if let (Some(bound), Some(schema)) = (bound, parameter.schema.as_mut()) {
                apply(schema, bound);
            }
        }
    }
    let properties: [(&str, &str, Bound); 15] = [
        ("BatchPutRequest", "messages", Bound::Items { min: 1, max: max_batch }),
        ("BatchAckRequest", "leases", Bound::Items { min: 1, max: max_batch }),
        ("BatchMessage", "id", id.clone()),
        ("BatchMessage", "group", id),
        ("BatchMessage", "delay", duration.clone()),
        ("BatchMessage", "idempotency_key", key),
        ("BatchMessage", "traceparent", traceparent),
        ("BatchNack", "delay", duration),
        ("RedriveRequest", "destination", Bound::NotNull),
        ("RedriveRequest", "destination", name),
        (
            "RedriveRequest",
            "max_per_second",
            Bound::Range { min: 1, max: Some(i64::from(crate::redrive::MAX_PER_SECOND)) },
        ),
        ("BatchMessage", "deliver_at", Bound::Range { min: 1, max: None }),
        ("BatchMessage", "text", Bound::NotNull),
        ("BatchMessage", "body", Bound::NotNull),
        ("BatchMessage", "body", Bound::Text { min: 0, max: usize::MAX, pattern: batch::BODY_PATTERN.to_owned() }),
    ];
    let Some(components) = openapi.components.as_mut() else { return };
    for (schema, property, bound) in &properties {
        let Some(RefOr::T(Schema::Object(object))) = components.schemas.get_mut(*schema) else { continue };
        if let Some(target) = object.properties.get_mut(*property) {
            apply(target, bound);
        }
    }
    // A batch message's body is exactly one of `text` and `body`.
    if let Some(RefOr::T(message)) = components.schemas.get_mut("BatchMessage") {
        let one_of = ["text", "body"]
            .map(|field| RefOr::T(Schema::Object(utoipa::openapi::ObjectBuilder::new().required(field).build())));
        let mut exactly_one = utoipa::openapi::schema::OneOf::new();
        exactly_one.items = one_of.into();
        let mut all_of = utoipa::openapi::schema::AllOf::new();
        all_of.items = vec![RefOr::T(message.clone()), RefOr::T(Schema::OneOf(exactly_one))];
        *message = Schema::AllOf(all_of);
    }
    // A message's attributes (`BTreeMap`: the map of a batch message and of a `?max=` answer).
    if let Some(RefOr::T(Schema::Object(attributes))) = components.schemas.get_mut("BTreeMap") {
        use crate::queue::attributes::{MAX_ATTRIBUTE_NAME_LEN, MAX_ATTRIBUTES, NAME_PATTERN, TYPE_PATTERN};
        attributes.max_properties = Some(MAX_ATTRIBUTES);
        if let Some(Schema::Object(names)) = attributes.property_names.as_deref_mut() {
            apply_to_object(
                names,
                &Bound::Text { min: 1, max: MAX_ATTRIBUTE_NAME_LEN, pattern: NAME_PATTERN.to_owned() },
            );
        }
        if let Some(AdditionalProperties::RefOr(RefOr::T(Schema::Object(attribute)))) =
            attributes.additional_properties.as_deref_mut()
            && let Some(data_type) = attribute.properties.get_mut("type")
        {
            apply(data_type, &Bound::Text { min: 1, max: MAX_ATTRIBUTE_NAME_LEN, pattern: TYPE_PATTERN.to_owned() });
        }
    }
}

/// Writes `bound` into `schema` (an `Option`'s schema is one of the type and `null`).
fn apply(schema: &mut RefOr<Schema>, bound: &Bound) {
    match (schema, bound) {
        (RefOr::T(Schema::Array(array)), Bound::Items { min, max }) => {
            array.min_items = Some(*min);
            array.max_items = Some(*max);
        },
        (RefOr::T(Schema::Object(object)), bound) => apply_to_object(object, bound),
        _ => {},
    }
}

fn apply_to_object(object: &mut Object, bound: &Bound) {
    match bound {
        Bound::Text { min, max, pattern } => {
            object.min_length = (*min > 0).then_some(*min);
            object.max_length = (*max != usize::MAX).then_some(*max);
            object.pattern = (!pattern.is_empty()).then(|| pattern.clone());
        },
        Bound::Range { min, max } => {
            object.minimum = Some(Number::Int(isize::try_from(*min).unwrap_or(isize::MAX)));
            object.maximum = max.map(|max| Number::Int(isize::try_from(max).unwrap_or(isize::MAX)));
        },
        Bound::NotNull => {
            if let SchemaType::Array(types) = &object.schema_type {
                let types: Vec<Type> = types.iter().filter(|t| **t != Type::Null).cloned().collect();
                object.schema_type = match types.as_slice() {
                    [only] => SchemaType::Type(only.clone()),
                    _ => SchemaType::Array(types),
                };
            }
        },
        Bound::Items { .. } => {},
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    fn document(config: &Config) -> Value {
        serde_json::from_str(&openapi_json(config)).unwrap_or(Value::Null)
    }

    fn parameter<'a>(spec: &'a Value, path: &str, method: &str, name: &str) -> &'a Value {
        let parameters = spec["paths"][path][method]["parameters"].as_array().map(Vec::as_slice).unwrap_or_default();
        parameters.iter().find(|p| p["name"] == name).map_or(&Value::Null, |p| &p["schema"])
    }

    /// The batch bounds are the configuration's: a zkq with another api.max_batch states that one.
    #[test]
    fn the_document_states_the_configured_batch_bounds() {
        let mut config = Config::default();
        config.api.max_batch = 7;
        let spec = document(&config);
        let schemas = &spec["components"]["schemas"];
        for (schema, field) in [("BatchPutRequest", "messages"), ("BatchAckRequest", "leases")] {
            let property = &schemas[schema]["properties"][field];
            assert_eq!((&property["minItems"], &property["maxItems"]), (&Value::from(1), &Value::from(7)), "{schema}");
        }
        for path in ["/v1/queues/{queue}/take", "/v1/queues/{queue}/leases"] {
            let max = parameter(&spec, path, "post", "max");
            assert_eq!((&max["minimum"], &max["maximum"]), (&Value::from(1), &Value::from(7)), "{path}: {max}");
        }
        let default = document(&Config::default());
        let messages = &default["components"]["schemas"]["BatchPutRequest"]["properties"]["messages"];
        assert_eq!(messages["maxItems"], Config::default().api.max_batch);
    }

    /// The other bounds come from the constants the checks use.
    #[test]
    fn the_document_states_the_handlers_bounds() {
        let spec = document(&Config::default());
        let schemas = &spec["components"]["schemas"];
        let traceparent = parameter(&spec, "/v1/queues/{queue}/messages", "post", "traceparent");
        assert_eq!(traceparent["pattern"], crate::types::Traceparent::pattern());
        assert_eq!(traceparent["maxLength"], crate::types::MAX_TRACEPARENT_LEN);
        let message = &schemas["BatchMessage"]["allOf"];
        assert_eq!(message[0]["properties"]["traceparent"]["pattern"], crate::types::Traceparent::pattern());
        assert_eq!(message[0]["properties"]["text"]["type"], "string", "text is a string when given, never null");
        assert_eq!(message[1]["oneOf"][0]["required"][0], "text", "exactly one of text and body: {message}");
        assert_eq!(message[1]["oneOf"][1]["required"][0], "body", "exactly one of text and body: {message}");
        let destination = &schemas["RedriveRequest"]["properties"]["destination"];
        assert_eq!(destination["type"], "string", "a destination is a queue name, never null: {destination}");
        assert_eq!(destination["pattern"], crate::types::name_pattern());
        assert_eq!(
            schemas["RedriveRequest"]["properties"]["max_per_second"]["maximum"],
            crate::redrive::MAX_PER_SECOND
        );
        assert_eq!(parameter(&spec, "/v1/queues/{queue}/messages", "get", "limit")["maximum"], MAX_PEEK_LIMIT);
        let queue = parameter(&spec, "/v1/counters/{name}", "get", "name");
        assert_eq!(queue["maxLength"], crate::types::MAX_NAME_LEN);
        assert_eq!(schemas["BTreeMap"]["maxProperties"], crate::queue::attributes::MAX_ATTRIBUTES);
        for (path, name) in [("/v1/queues/{queue}/take", "wait"), ("/v1/queues/{queue}/leases/{lease}/nack", "delay")] {
            assert_eq!(parameter(&spec, path, "post", name)["pattern"], DURATION_PATTERN, "{path}");
        }
    }
}
