//! The two wire protocols of SQS, decoded into one request shape and encoded from one answer
//! shape: the AWS JSON 1.0 protocol (current SDKs) and the query protocol (form-encoded requests,
//! XML answers; older SDKs and Debian's AWS CLI).
//!
//! Both decode to the JSON protocol's shape of the action's input (a query request's flattened
//! lists and maps, such as `SendMessageBatchRequestEntry.1.Id` or `Attribute.1.Name`, become the
//! JSON protocol's `Entries` and `Attributes`), so each action has one input type. An answer is the
//! JSON protocol's output object; the query protocol writes it as XML in the 2012-11-05 namespace,
//! or, asked with `Accept: application/json`, as that XML's tree in JSON ([`Protocol::QueryInJson`]).
//!
//! A query-protocol request may be sent to a queue's URL (`/ACCOUNT/QUEUE`) instead of the root:
//! the path then names the queue when no `QueueUrl` parameter does ([`addressed`]).

use std::collections::BTreeMap;

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};

use super::error::{SqsError, UNKNOWN_OPERATION};

/// The namespace of the query protocol's XML.
const XML_NAMESPACE: &str = "http://queue.amazonaws.com/doc/2012-11-05/";
/// The JSON protocol's content type.
const JSON_CONTENT_TYPE: &str = "application/x-amz-json-1.0";
/// The JSON protocol's action header, `AmazonSQS.<Action>`.
pub(super) const TARGET_HEADER: &str = "x-amz-target";
pub(super) const TARGET_PREFIX: &str = "AmazonSQS.";

/// The most dot-separated parts a query parameter's name may have.
const MAX_KEY_PARTS: usize = 8;

/// The most parameters a query-protocol request may have (the URL's and the body's together).
/// SQS's largest request, a `SendMessageBatch` of 10 entries with 10 message attributes each and a
/// trace header, has about 400.
pub(super) const MAX_QUERY_PARAMETERS: usize = 1_000;

/// The most distinct names one level of a query request's parameters may have: the names at the
/// top, or the members of one list or map (`Tag.1` … `Tag.50`, `SendMessageBatchRequestEntry.1` …
/// `.10`). With [`MAX_QUERY_PARAMETERS`] and [`MAX_KEY_PARTS`] it bounds the tree a request is
/// decoded into.
pub(super) const MAX_NAMES_PER_LEVEL: usize = 100;

/// Which protocol a request came in, and so which its answer goes out in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Protocol {
    /// AWS's JSON 1.0 protocol: `X-Amz-Target` names the action, the body is a JSON object.
    Json,
    /// The query protocol, answered in XML.
    Query,
    /// The query protocol from a client that accepts JSON (`Accept: application/json`), as SQS
    /// allows: the XML answer's tree written as JSON objects, `{"<Action>Response":
    /// {"<Action>Result": …, "ResponseMetadata": …}}`, an error as `{"Error": {…}, "RequestId": …}`.
    QueryInJson,
}

/// A request decoded: its action and its input in the JSON protocol's shape.
#[derive(Debug)]
pub(super) struct Decoded {
    pub(super) action: String,
    pub(super) input: Value,
}

/// Which protocol `headers` say a request is in: JSON when its content type is the JSON
/// protocol's or it names an `X-Amz-Target`, else the query protocol: answered in JSON when the
/// request's `Accept` names `application/json` (and not the XML it may also name first).
pub(super) fn protocol_of(headers: &HeaderMap) -> Protocol {
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    if content_type.starts_with(JSON_CONTENT_TYPE) || headers.contains_key(TARGET_HEADER) {
        return Protocol::Json;
    }
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
    let first = accept
        .split(',')
        .map(|kind| kind.split(';').next().unwrap_or("").trim())
        .find(|kind| matches!(*kind, "application/json" | "text/xml" | "application/xml"));
    if first == Some("application/json") { Protocol::QueryInJson } else { Protocol::Query }
}

/// The path of a queue's URL, `/ACCOUNT/QUEUE`: two non-empty segments.
pub(super) fn is_queue_path(path: &str) -> bool {
    let mut segments = path.trim_start_matches('/').split('/');
    matches!((segments.next(), segments.next(), segments.next()), (Some(a), Some(q), None) if !a.is_empty() && !q.is_empty())
}

/// A query-protocol request sent to a queue's URL, `origin` + `path`, as SQS reads it: the
/// actions that name no queue (`CreateQueue`, `ListQueues`) are not valid there, and the URL is
/// the request's `QueueUrl` unless a parameter names one.
pub(super) fn addressed(mut decoded: Decoded, origin: &str, path: &str) -> Result<Decoded, SqsError> {
    if !is_queue_path(path) {
        return Ok(decoded);
    }
    if matches!(decoded.action.as_str(), "CreateQueue" | "ListQueues") {
        return Err(SqsError::not_for_endpoint(&decoded.action));
    }
    if let Value::Object(input) = &mut decoded.input {
        input.entry("QueueUrl").or_insert_with(|| Value::String(format!("{origin}{path}")));
    }
    Ok(decoded)
}

/// Decodes a JSON-protocol request: the action from `X-Amz-Target`, the input from the body.
pub(super) fn decode_json(headers: &HeaderMap, body: &[u8]) -> Result<Decoded, SqsError> {
    let target = headers.get(TARGET_HEADER).and_then(|v| v.to_str().ok()).unwrap_or("");
    let Some(action) = target.strip_prefix(TARGET_PREFIX).filter(|a| !a.is_empty()) else {
        return Err(SqsError::invalid_action(format!(
            "the X-Amz-Target header must be {TARGET_PREFIX}<Action>, not {target:?}"
        )));
    };
    let input = if body.iter().all(u8::is_ascii_whitespace) {
        Value::Object(Map::new())
    } else {
        serde_json::from_slice(body)
            .map_err(|err| SqsError::serialization(format!("the body is not a JSON object: {err}")))?
    };
    if !input.is_object() {
        return Err(SqsError::serialization("the body must be a JSON object"));
    }
    Ok(Decoded { action: action.to_owned(), input })
}

/// Decodes a query-protocol request: `Action=…` and its parameters, from the form body and the
/// URL's query string (the body wins). `is_action` tells the actions zkq knows.
///
/// What a request can make zkq hold is bounded before anything is built: at most
/// [`MAX_QUERY_PARAMETERS`] parameters (counted on the raw bytes, before decoding), each name of
/// at most [`MAX_KEY_PARTS`] parts; the action is looked at before the parameters are; and at most
/// [`MAX_NAMES_PER_LEVEL`] names per level of the tree. Past a bound the request answers
/// `InvalidParameterValue`, an unknown action `InvalidAction`.
pub(super) fn decode_query(
    uri_query: Option<&str>,
    body: &[u8],
    is_action: impl Fn(&str) -> bool,
) -> Result<Decoded, SqsError> {
    let sources = [uri_query.unwrap_or("").as_bytes(), body];
    let count: usize =
        sources.iter().map(|source| source.split(|b| *b == b'&').filter(|part| !part.is_empty()).count()).sum();
    if count > MAX_QUERY_PARAMETERS {
        return Err(SqsError::invalid_parameter(format!(
            "the request has {count} parameters; zkq's SQS API accepts at most {MAX_QUERY_PARAMETERS}"
        )));
    }
    let mut pairs: Vec<(String, String)> = Vec::with_capacity(count);
    for source in sources {
        let parsed: Vec<(String, String)> = serde_urlencoded::from_bytes(source)
            .map_err(|err| SqsError::invalid_parameter(format!("the form is not URL-encoded: {err}")))?;
        pairs.extend(parsed);
    }
    // The body's `Action` wins over the URL's.
    let action = pairs.iter().rev().find(|(key, _)| key == "Action").map(|(_, value)| value.clone());
    let Some(action) = action.filter(|a| !a.is_empty()) else {
        return Err(SqsError::unknown_operation());
    };
    if !is_action(&action) {
        return Err(SqsError::not_for_endpoint(&action));
    }
    let mut tree = Tree::default();
    for (key, value) in pairs {
        // The deepest SQS parameter is `SendMessageBatchRequestEntry.N.MessageAttribute.N.Value.StringValue`.
        if key.split('.').count() > MAX_KEY_PARTS {
            return Err(SqsError::invalid_parameter(format!(
                "parameter {:?} has more than {MAX_KEY_PARTS} dot-separated parts",
                key.chars().take(100).collect::<String>()
            )));
        }
        match key.as_str() {
            // Where the request came from, not what it asks: not part of any input.
            "Action" | "Version" | "AWSAccessKeyId" | "Signature" | "SignatureMethod" | "SignatureVersion"
            | "Timestamp" | "Expires" | "SecurityToken" => {},
            _ => tree.insert(&key, value)?,
        }
    }
    Ok(Decoded { action, input: Value::Object(tree.into_input()?) })
}

/// Flattened query parameters, split at their dots.
#[derive(Debug, Default)]
struct Tree(BTreeMap<String, Node>);

#[derive(Debug)]
enum Node {
    Leaf(String),
    Branch(Tree),
}

impl Tree {
    /// Adds the parameter `key`; refused when a level would hold more than [`MAX_NAMES_PER_LEVEL`] names.
    fn insert(&mut self, key: &str, value: String) -> Result<(), SqsError> {
        let (first, rest) = match key.split_once('.') {
            None => (key, None),
            Some((first, rest)) => (first, Some(rest)),
        };
        if !self.0.contains_key(first) && self.0.len() >= MAX_NAMES_PER_LEVEL {
            return Err(SqsError::invalid_parameter(format!(
                "parameter {:?}: a level of a request's parameters holds at most {MAX_NAMES_PER_LEVEL} names",
                key.chars().take(100).collect::<String>()
            )));
        }
        match rest {
            None => {
                self.0.insert(first.to_owned(), Node::Leaf(value));
                Ok(())
            },
            Some(rest) => {
                let node = self.0.entry(first.to_owned()).or_insert_with(|| Node::Branch(Tree::default()));
                if let Node::Leaf(_) = node {
                    *node = Node::Branch(Tree::default());
                }
                match node {
                    Node::Branch(tree) => tree.insert(rest, value),
                    Node::Leaf(_) => Ok(()),
                }
            },
        }
    }

    /// The members of a flattened list (`Name.1`, `Name.2`, …), in index order.
    fn members(self, name: &str) -> Result<Vec<Node>, SqsError> {
        let mut indexed = Vec::with_capacity(self.0.len());
        for (index, node) in self.0 {
            let Ok(at) = index.parse::<u32>() else {
                return Err(SqsError::invalid_parameter(format!("{name}.{index}: a list index must be a number")));
            };
            indexed.push((at, node));
        }
        indexed.sort_by_key(|(at, _)| *at);
        Ok(indexed.into_iter().map(|(_, node)| node).collect())
    }

    /// The JSON-protocol input these parameters stand for.
    fn into_input(self) -> Result<Map<String, Value>, SqsError> {
        let mut out = Map::new();
        for (key, node) in self.0 {
            let (name, value) = match (key.as_str(), node) {
                // botocore sends an empty list as its member name with no value.
                (
                    "AttributeNames"
                    | "MessageAttributeNames"
                    | "MessageSystemAttributeNames"
                    | "Entries"
                    | "TagKeys"
                    | "AWSAccountIds"
                    | "Actions",
                    Node::Leaf(text),
                ) if text.is_empty() => (key.clone(), Value::Array(Vec::new())),
                (_, Node::Leaf(text)) => (key.clone(), Value::String(text)),
                (
                    "AttributeName"
                    | "MessageAttributeName"
                    | "MessageSystemAttributeName"
                    | "TagKey"
                    | "AWSAccountId"
                    | "ActionName",
                    Node::Branch(list),
                ) => {
                    let items = list.members(&key)?.into_iter().filter_map(leaf).map(Value::String).collect();
                    // `ActionName.N` is the JSON protocol's `Actions`.
                    let name = if key == "ActionName" { "Actions".to_owned() } else { format!("{key}s") };
                    (name, Value::Array(items))
                },
                ("Attribute" | "Tag", Node::Branch(list)) => {
                    let key_name = if key == "Tag" { "Key" } else { "Name" };
                    let mut map = Map::new();
                    for member in list.members(&key)? {
                        let Node::Branch(mut entry) = member else { continue };
                        let name = entry.0.remove(key_name).and_then(leaf);
                        let value = entry.0.remove("Value").and_then(leaf);
                        if let (Some(name), Some(value)) = (name, value) {
                            map.insert(name, Value::String(value));
                        }
                    }
                    (if key == "Tag" { "Tags".to_owned() } else { "Attributes".to_owned() }, Value::Object(map))
                },
                ("MessageAttribute" | "MessageSystemAttribute", Node::Branch(list)) => {
                    let mut map = Map::new();
                    for member in list.members(&key)? {
                        let Node::Branch(mut entry) = member else { continue };
                        let name = entry.0.remove("Name").and_then(leaf);
                        let value = match entry.0.remove("Value") {
                            Some(Node::Branch(value)) => Value::Object(value.into_input()?),
                            _ => Value::Object(Map::new()),
                        };
                        if let Some(name) = name {
                            map.insert(name, value);
                        }
                    }
                    (format!("{key}s"), Value::Object(map))
                },
                (entries, Node::Branch(list)) if entries.ends_with("RequestEntry") => {
                    let mut items = Vec::new();
                    for member in list.members(&key)? {
                        if let Node::Branch(entry) = member {
                            items.push(Value::Object(entry.into_input()?));
                        }
                    }
                    ("Entries".to_owned(), Value::Array(items))
                },
                (_, Node::Branch(tree)) => (key.clone(), Value::Object(tree.into_input()?)),
            };
            out.insert(name, value);
        }
        Ok(out)
    }
}

fn leaf(node: Node) -> Option<String> {
    match node {
        Node::Leaf(text) => Some(text),
        Node::Branch(_) => None,
    }
}

/// The answer to `action` in `protocol`: `output` is the JSON protocol's output object.
pub(super) fn encode(protocol: Protocol, action: &str, output: Value, request_id: &str) -> Response {
    let mut headers = HeaderMap::new();
    if let Ok(id) = HeaderValue::from_str(request_id) {
        headers.insert("x-amzn-requestid", id);
    }
    let fields = match &output {
        Value::Object(fields) if !fields.is_empty() => Some(fields),
        _ => None,
    };
    match protocol {
        Protocol::Json => {
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(JSON_CONTENT_TYPE));
            (StatusCode::OK, headers, output.to_string()).into_response()
        },
        Protocol::Query => {
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/xml"));
            let mut xml = format!("<?xml version=\"1.0\"?><{action}Response xmlns=\"{XML_NAMESPACE}\">");
            if let Some(fields) = fields {
                xml.push_str(&format!("<{action}Result>"));
                write_fields(&mut xml, action, fields);
                xml.push_str(&format!("</{action}Result>"));
            } else if has_result(action) {
                xml.push_str(&format!("<{action}Result/>"));
            }
            xml.push_str(&format!(
                "<ResponseMetadata><RequestId>{}</RequestId></ResponseMetadata></{action}Response>",
                escape(request_id)
            ));
            (StatusCode::OK, headers, xml).into_response()
        },
        Protocol::QueryInJson => {
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            let mut response = Map::new();
            if let Some(fields) = fields {
                response.insert(format!("{action}Result"), Value::Object(json_fields(fields)));
            } else if has_result(action) {
                response.insert(format!("{action}Result"), Value::Object(Map::new()));
            }
            response.insert("ResponseMetadata".to_owned(), serde_json::json!({ "RequestId": request_id }));
            let body = Value::Object(Map::from_iter([(format!("{action}Response"), Value::Object(response))]));
            (StatusCode::OK, headers, body.to_string()).into_response()
        },
    }
}

/// `err` in `protocol`'s shape: the JSON protocol's `__type` (with the `x-amzn-query-error` header
/// that SDKs read to keep the classic codes), or the query protocol's `ErrorResponse` (in XML, or
/// its tree in JSON). A request that names no action is answered SQS's bare
/// `<UnknownOperationException/>` in either query dialect.
pub(super) fn encode_error(protocol: Protocol, err: SqsError, request_id: &str) -> Response {
    let mut headers = HeaderMap::new();
    if let Ok(id) = HeaderValue::from_str(request_id) {
        headers.insert("x-amzn-requestid", id);
    }
    let fault = if err.sender_fault { "Sender" } else { "Receiver" };
    match protocol {
        Protocol::Json => {
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(JSON_CONTENT_TYPE));
            if let Ok(value) = HeaderValue::from_str(&format!("{};{fault}", err.code)) {
                headers.insert("x-amzn-query-error", value);
            }
            let body = serde_json::json!({
                "__type": format!("com.amazonaws.sqs#{}", err.shape),
                "message": err.message,
            });
            (err.status, headers, body.to_string()).into_response()
        },
        Protocol::Query | Protocol::QueryInJson if err.code == UNKNOWN_OPERATION => {
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/xml"));
            (err.status, headers, format!("<?xml version=\"1.0\"?><{UNKNOWN_OPERATION}/>")).into_response()
        },
        Protocol::Query => {
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/xml"));
            let body = format!(
                "<?xml version=\"1.0\"?><ErrorResponse xmlns=\"{XML_NAMESPACE}\"><Error><Type>{fault}</Type>\
                 <Code>{}</Code><Message>{}</Message><Detail/></Error><RequestId>{}</RequestId></ErrorResponse>",
                err.code,
                escape(err.query_message()),
                escape(request_id)
            );
            (err.status, headers, body).into_response()
        },
        Protocol::QueryInJson => {
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            let body = serde_json::json!({
                "Error": { "Type": fault, "Code": err.code, "Message": err.query_message(), "Detail": null },
                "RequestId": request_id,
            });
            (err.status, headers, body.to_string()).into_response()
        },
    }
}

/// Whether `action` answers with a result element even when it holds nothing.
fn has_result(action: &str) -> bool {
    matches!(
        action,
        "ReceiveMessage"
            | "ListQueues"
            | "GetQueueAttributes"
            | "ListDeadLetterSourceQueues"
            | "ListQueueTags"
            | "ListMessageMoveTasks"
    )
}

/// The element a member of the list `field` is written as in the answer to `action`.
fn list_item(action: &str, field: &str) -> String {
    match field {
        "Messages" => "Message".to_owned(),
        "QueueUrls" | "queueUrls" => "QueueUrl".to_owned(),
        "Successful" => format!("{action}ResultEntry"),
        "Failed" => "BatchResultErrorEntry".to_owned(),
        "Results" => format!("{action}ResultEntry"),
        other => other.trim_end_matches('s').to_owned(),
    }
}

fn write_fields(xml: &mut String, action: &str, fields: &Map<String, Value>) {
    for (field, value) in fields {
        match (field.as_str(), value) {
            ("Attributes", Value::Object(map)) => {
                for (name, value) in map {
                    xml.push_str(&format!(
                        "<Attribute><Name>{}</Name><Value>{}</Value></Attribute>",
                        escape(name),
                        escape(&scalar(value))
                    ));
                }
            },
            ("Tags", Value::Object(map)) => {
                for (name, value) in map {
                    xml.push_str(&format!(
                        "<Tag><Key>{}</Key><Value>{}</Value></Tag>",
                        escape(name),
                        escape(&scalar(value))
                    ));
                }
            },
            ("MessageAttributes", Value::Object(map)) => {
                for (name, value) in map {
                    xml.push_str(&format!("<MessageAttribute><Name>{}</Name><Value>", escape(name)));
                    if let Value::Object(inner) = value {
                        write_fields(xml, action, inner);
                    }
                    xml.push_str("</Value></MessageAttribute>");
                }
            },
            (_, Value::Array(items)) => {
                let item = list_item(action, field);
                for member in items {
                    match member {
                        Value::Object(inner) => {
                            xml.push_str(&format!("<{item}>"));
                            write_fields(xml, action, inner);
                            xml.push_str(&format!("</{item}>"));
                        },
                        other => xml.push_str(&format!("<{item}>{}</{item}>", escape(&scalar(other)))),
                    }
                }
            },
            (_, Value::Object(inner)) => {
                xml.push_str(&format!("<{field}>"));
                write_fields(xml, action, inner);
                xml.push_str(&format!("</{field}>"));
            },
            (_, Value::Null) => {},
            (_, other) => xml.push_str(&format!("<{field}>{}</{field}>", escape(&scalar(other)))),
        }
    }
}

/// The tree [`write_fields`] writes as XML, as JSON: each repeated element a list under its
/// field's name (`Attributes`, `Tags` and `MessageAttributes` lists of name and value, as their
/// XML elements are), every leaf a string.
fn json_fields(fields: &Map<String, Value>) -> Map<String, Value> {
    let pairs = |map: &Map<String, Value>, key: &str, nested: bool| -> Value {
        let members = map.iter().map(|(name, value)| {
            let value = match value {
                Value::Object(inner) if nested => Value::Object(json_fields(inner)),
                other => Value::String(scalar(other)),
            };
            serde_json::json!({ key: name, "Value": value })
        });
        Value::Array(members.collect())
    };
    let mut out = Map::new();
    for (field, value) in fields {
        let converted = match (field.as_str(), value) {
            ("Attributes", Value::Object(map)) => pairs(map, "Name", false),
            ("Tags", Value::Object(map)) => pairs(map, "Key", false),
            ("MessageAttributes", Value::Object(map)) => pairs(map, "Name", true),
            (_, Value::Array(items)) => Value::Array(
                items
                    .iter()
                    .map(|member| match member {
                        Value::Object(inner) => Value::Object(json_fields(inner)),
                        other => Value::String(scalar(other)),
                    })
                    .collect(),
            ),
            (_, Value::Object(inner)) => Value::Object(json_fields(inner)),
            (_, Value::Null) => continue,
            (_, other) => Value::String(scalar(other)),
        };
        out.insert(field.clone(), converted);
    }
    out
}

fn scalar(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// Text as XML character data: `&`, `<`, `>`, `"` and carriage returns escaped (SQS bodies may
/// hold `\r`, which XML parsers would otherwise turn into `\n`).
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\r' => out.push_str("&#xD;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_client_that_prefers_json_is_answered_in_json() {
        let with_accept = |accept: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::ACCEPT, accept.parse().expect("value"));
            protocol_of(&headers)
        };
        assert_eq!(protocol_of(&HeaderMap::new()), Protocol::Query);
        assert_eq!(with_accept("application/json"), Protocol::QueryInJson);
        assert_eq!(with_accept("application/json; q=0.9, text/xml"), Protocol::QueryInJson);
        assert_eq!(with_accept("text/xml, application/json"), Protocol::Query);
        assert_eq!(with_accept("*/*"), Protocol::Query);
    }

    #[test]
    fn only_a_path_of_account_and_queue_addresses_a_queue() {
        for (path, queue) in [("/", false), ("/000000000000/q", true), ("/0/q/", false), ("/0", false), ("//q", false)]
        {
            assert_eq!(is_queue_path(path), queue, "{path}");
        }
        let decoded = Decoded { action: "SendMessage".to_owned(), input: serde_json::json!({ "MessageBody": "b" }) };
        let addressed = addressed(decoded, "http://h", "/0/q").expect("a queue's action");
        assert_eq!(addressed.input["QueueUrl"], "http://h/0/q");
        let listed = Decoded { action: "ListQueues".to_owned(), input: serde_json::json!({}) };
        assert_eq!(addressed_code(listed), "InvalidAction");
    }

    fn addressed_code(decoded: Decoded) -> &'static str {
        addressed(decoded, "http://h", "/0/q").map_or_else(|err| err.code, |_| "ok")
    }

    #[test]
    fn the_json_dialect_of_a_query_answer_lists_what_xml_repeats() {
        let output = serde_json::json!({
            "Messages": [{
                "Body": "b",
                "Attributes": { "SenderId": "s" },
                "MessageAttributes": { "k": { "StringValue": "v", "DataType": "String" } },
                "MD5OfMessageAttributes": null,
            }],
        });
        let Value::Object(fields) = output else { unreachable!("an object") };
        let tree = Value::Object(json_fields(&fields));
        assert_eq!(
            tree,
            serde_json::json!({ "Messages": [{
                "Body": "b",
                "Attributes": [{ "Name": "SenderId", "Value": "s" }],
                "MessageAttributes": [{ "Name": "k", "Value": { "StringValue": "v", "DataType": "String" } }],
            }] })
        );
    }

    #[test]
    fn a_query_request_decodes_to_the_json_shape() {
        let body = "Action=SendMessageBatch&Version=2012-11-05&QueueUrl=http%3A%2F%2Fh%2F000000000000%2Fq\
                    &SendMessageBatchRequestEntry.2.Id=b&SendMessageBatchRequestEntry.2.MessageBody=two\
                    &SendMessageBatchRequestEntry.1.Id=a&SendMessageBatchRequestEntry.1.MessageBody=one\
                    &SendMessageBatchRequestEntry.1.MessageAttribute.1.Name=k\
                    &SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.StringValue=v\
                    &SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.DataType=String";
        let decoded = decode_query(None, body.as_bytes(), |_| true).expect("decodes");
        assert_eq!(decoded.action, "SendMessageBatch");
        assert_eq!(
            decoded.input,
            serde_json::json!({
                "QueueUrl": "http://h/000000000000/q",
                "Entries": [
                    { "Id": "a", "MessageBody": "one", "MessageAttributes": { "k": { "StringValue": "v", "DataType": "String" } } },
                    { "Id": "b", "MessageBody": "two" },
                ],
            })
        );
        let decoded =
            decode_query(Some("Action=GetQueueAttributes&AttributeName.2=B&AttributeName.1=A"), b"", |_| true)
                .expect("decodes");
        assert_eq!(decoded.input, serde_json::json!({ "AttributeNames": ["A", "B"] }));
        let decoded = decode_query(
            None,
            b"Action=CreateQueue&QueueName=q&Attribute.1.Name=VisibilityTimeout&Attribute.1.Value=5",
            |_| true,
        )
        .expect("decodes");
        assert_eq!(decoded.input, serde_json::json!({ "QueueName": "q", "Attributes": { "VisibilityTimeout": "5" } }));
        assert!(decode_query(None, b"QueueName=q", |_| true).is_err(), "no action");
        assert!(decode_query(None, b"Action=X&AttributeName.x=A", |_| true).is_err(), "not an index");
        let deep = format!("Action=X&{}=1", vec!["a"; 100_000].join("."));
        assert!(
            decode_query(None, deep.as_bytes(), |_| true).is_err(),
            "a name too deep is refused, not recursed into"
        );
        // Bounded before anything is built: the parameters, the action, the names per level.
        let many = (0..=MAX_QUERY_PARAMETERS).map(|i| format!("{i}.b=")).collect::<Vec<_>>().join("&");
        let err = decode_query(None, format!("Action=SendMessage&{many}").as_bytes(), |_| true).expect_err("refused");
        assert_eq!(err.code, "InvalidParameterValue");
        assert!(err.message.contains("parameters"), "{}", err.message);
        let err = decode_query(None, b"Action=Nope&A.1=x", |a| a == "SendMessage").expect_err("refused");
        assert_eq!(err.code, "InvalidAction");
        let wide = (0..=MAX_NAMES_PER_LEVEL).map(|i| format!("Tag.{i}.Key=k")).collect::<Vec<_>>().join("&");
        let err = decode_query(None, format!("Action=TagQueue&{wide}").as_bytes(), |_| true).expect_err("refused");
        assert!(err.message.contains("names"), "{}", err.message);
        // SQS's largest request still decodes: 10 entries with 10 message attributes each.
        let mut batch = vec!["Action=SendMessageBatch".to_owned(), "QueueUrl=http://h/0/q".to_owned()];
        for e in 1..=10 {
            let entry = format!("SendMessageBatchRequestEntry.{e}");
            batch.push(format!("{entry}.Id=e{e}&{entry}.MessageBody=b"));
            for a in 1..=10 {
                let attribute = format!("{entry}.MessageAttribute.{a}");
                batch.push(format!(
                    "{attribute}.Name=n{a}&{attribute}.Value.DataType=String&{attribute}.Value.StringValue=v"
                ));
            }
        }
        let decoded = decode_query(None, batch.join("&").as_bytes(), |_| true).expect("decodes");
        let entries = decoded.input["Entries"].as_array().expect("entries");
        assert_eq!(entries.len(), 10);
        assert!(entries.iter().all(|e| e["MessageAttributes"].as_object().is_some_and(|m| m.len() == 10)));
    }

    #[test]
    fn an_answer_is_written_as_xml_for_the_query_protocol() {
        let output = serde_json::json!({
            "Messages": [{ "MessageId": "m", "Body": "a<b & \"c\"\r", "Attributes": { "SentTimestamp": "1" } }],
        });
        let response = encode(Protocol::Query, "ReceiveMessage", output, "rid");
        assert_eq!(response.status(), StatusCode::OK);
        let body = futures::executor::block_on(axum::body::to_bytes(response.into_body(), usize::MAX)).expect("body");
        assert_eq!(
            std::str::from_utf8(&body).expect("utf-8"),
            format!(
                "<?xml version=\"1.0\"?><ReceiveMessageResponse xmlns=\"{XML_NAMESPACE}\"><ReceiveMessageResult>\
                 <Message><Attributes_placeholder/></Message></ReceiveMessageResult><ResponseMetadata><RequestId>rid\
                 </RequestId></ResponseMetadata></ReceiveMessageResponse>"
            )
            .replace(
                "<Attributes_placeholder/>",
                "<Attribute><Name>SentTimestamp</Name><Value>1</Value></Attribute><Body>a&lt;b &amp; &quot;c&quot;&#xD;</Body><MessageId>m</MessageId>"
            )
        );
    }
}
