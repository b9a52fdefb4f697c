//! Writing answers: JSON, YAML, Table and PartialObjectMetadata forms of
//! objects and lists, `Status` errors, and `Warning` headers.

use axum::body::Body;
use axum::http::{header, HeaderValue, Response, StatusCode};
use bytes::Bytes;
use serde_json::{json, Value};
use skiff_core::resources::ResourceInfo;
use skiff_core::ApiError;

use crate::negotiate::Output;
use crate::options::ListOutput;
use crate::request::Query;

/// A response with its body.
pub type Resp = Response<Body>;

/// A JSON response.
pub fn json_response(code: u16, v: &Value) -> Resp {
    bytes_response(
        code,
        "application/json",
        Bytes::from(serde_json::to_vec(v).unwrap_or_default()),
    )
}

pub fn bytes_response(code: u16, content_type: &str, body: Bytes) -> Resp {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(header::CONTENT_TYPE, content_type)
        .body(Body::from(body))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

/// An error as a `Status` response.
pub fn error_response(e: &ApiError) -> Resp {
    let mut r = json_response(e.code, &e.to_status());
    if let Some(s) = e.retry_after_seconds {
        if let Ok(v) = HeaderValue::from_str(&s.to_string()) {
            r.headers_mut().insert(header::RETRY_AFTER, v);
        }
    }
    add_warnings(r, &e.warnings)
}

pub fn text(code: u16, s: &str) -> Resp {
    bytes_response(
        code,
        "text/plain; charset=utf-8",
        Bytes::from(s.to_string()),
    )
}

/// Adds `Warning: 299 - "..."` headers.
pub fn add_warnings(mut r: Resp, warnings: &[String]) -> Resp {
    for w in warnings {
        let v = format!("299 - \"{}\"", w.replace('\\', "\\\\").replace('"', "\\\""));
        if let Ok(hv) = HeaderValue::from_str(&v) {
            r.headers_mut().append(header::WARNING, hv);
        }
    }
    r
}

/// One object in the form the client asked for.
pub fn render_object(
    res: &ResourceInfo,
    code: u16,
    obj: &Value,
    output: Output,
) -> Result<Resp, ApiError> {
    match output {
        Output::Json | Output::Discovery { .. } => Ok(json_response(code, obj)),
        Output::Yaml => Ok(bytes_response(
            code,
            "application/yaml",
            Bytes::from(serde_yaml_ng::to_string(obj).unwrap_or_default()),
        )),
        Output::Table { v1beta1 } => {
            let t = table(
                res,
                std::slice::from_ref(obj),
                v1beta1,
                None,
                None,
                None,
                true,
                "Metadata",
            );
            Ok(json_response(code, &t))
        }
        Output::PartialMetadata { v1beta1 } => {
            Ok(json_response(code, &partial_metadata(obj, v1beta1)))
        }
    }
}

/// The `PartialObjectMetadata` of an object.
pub fn partial_metadata(obj: &Value, v1beta1: bool) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": if v1beta1 { "meta.k8s.io/v1beta1" } else { "meta.k8s.io/v1" },
        "metadata": obj.get("metadata").cloned().unwrap_or(json!({})),
    })
}

/// A meta.k8s.io Table of objects; `include` is `includeObject` (None, Metadata, Object).
#[allow(clippy::too_many_arguments)]
pub fn table(
    res: &ResourceInfo,
    objs: &[Value],
    v1beta1: bool,
    rv: Option<i64>,
    cont: Option<&str>,
    remaining: Option<i64>,
    with_columns: bool,
    include: &str,
) -> Value {
    if let Some(c) = res.rules.custom() {
        // A custom resource's additionalPrinterColumns.
        return table_with(
            c.columns,
            &|o, now| c.cells(o, now),
            objs,
            v1beta1,
            rv,
            cont,
            remaining,
            with_columns,
            include,
        );
    }
    table_of(
        res.rules.printer(),
        objs,
        v1beta1,
        rv,
        cont,
        remaining,
        with_columns,
        include,
    )
}

/// [`table`] with a printer (also of kinds without a resource of their
/// own, as the `Scale` of the scale subresource).
#[allow(clippy::too_many_arguments)]
pub fn table_of(
    printer: &skiff_core::table::Printer,
    objs: &[Value],
    v1beta1: bool,
    rv: Option<i64>,
    cont: Option<&str>,
    remaining: Option<i64>,
    with_columns: bool,
    include: &str,
) -> Value {
    table_with(
        printer.columns,
        &|o, now| (printer.cells)(o, now),
        objs,
        v1beta1,
        rv,
        cont,
        remaining,
        with_columns,
        include,
    )
}

/// [`table_of`] with the columns and the cells apart.
#[allow(clippy::too_many_arguments)]
fn table_with(
    cols: &[skiff_core::table::Column],
    cells: &dyn Fn(&Value, chrono::DateTime<chrono::Utc>) -> Vec<Value>,
    objs: &[Value],
    v1beta1: bool,
    rv: Option<i64>,
    cont: Option<&str>,
    remaining: Option<i64>,
    with_columns: bool,
    include: &str,
) -> Value {
    let now = chrono::Utc::now();
    let rows: Vec<Value> = objs
        .iter()
        .map(|o| {
            let object = match include {
                "None" => Value::Null,
                "Object" => o.clone(),
                _ => partial_metadata(o, v1beta1),
            };
            let mut row = json!({"cells": cells(o, now), "object": object});
            if object_is_null(&row) {
                row.as_object_mut().map(|m| m.remove("object"));
            }
            row
        })
        .collect();
    let mut meta = json!({});
    if let Some(rv) = rv {
        meta["resourceVersion"] = json!(rv.to_string());
    }
    if let Some(c) = cont {
        meta["continue"] = json!(c);
    }
    if let Some(r) = remaining {
        meta["remainingItemCount"] = json!(r);
    }
    json!({
        "kind": "Table",
        "apiVersion": if v1beta1 { "meta.k8s.io/v1beta1" } else { "meta.k8s.io/v1" },
        "metadata": meta,
        "columnDefinitions": if with_columns { skiff_core::table::column_definitions_json(cols) } else { json!([]) },
        "rows": rows,
    })
}

fn object_is_null(row: &Value) -> bool {
    row.get("object").map(Value::is_null).unwrap_or(true)
}

pub fn render_list(
    res: &'static ResourceInfo,
    out: ListOutput,
    output: Output,
    q: &Query,
) -> Result<Resp, ApiError> {
    // The items are in `res`'s version already (conversion::list_from_storage).
    match output {
        Output::Table { v1beta1 } => {
            let objs: Vec<Value> = out
                .items
                .iter()
                .filter_map(|b| serde_json::from_slice(b).ok())
                .collect();
            let include = q.get("includeObject").unwrap_or("Metadata");
            let t = table(
                res,
                &objs,
                v1beta1,
                Some(out.resource_version),
                out.continue_token.as_deref(),
                out.remaining,
                true,
                include,
            );
            Ok(json_response(200, &t))
        }
        Output::PartialMetadata { v1beta1 } => {
            let items: Vec<Value> = out
                .items
                .iter()
                .filter_map(|b| serde_json::from_slice::<Value>(b).ok())
                .map(|o| partial_metadata(&o, v1beta1))
                .collect();
            let mut meta = json!({"resourceVersion": out.resource_version.to_string()});
            if let Some(c) = &out.continue_token {
                meta["continue"] = json!(c);
            }
            Ok(json_response(
                200,
                &json!({"kind": "PartialObjectMetadataList", "apiVersion": if v1beta1 { "meta.k8s.io/v1beta1" } else { "meta.k8s.io/v1" }, "metadata": meta, "items": items}),
            ))
        }
        Output::Yaml => {
            let items: Vec<Value> = out
                .items
                .iter()
                .filter_map(|b| serde_json::from_slice(b).ok())
                .collect();
            let v = json!({"kind": res.list_kind(), "apiVersion": res.api_version(), "metadata": {"resourceVersion": out.resource_version.to_string()}, "items": items});
            Ok(bytes_response(
                200,
                "application/yaml",
                Bytes::from(serde_yaml_ng::to_string(&v).unwrap_or_default()),
            ))
        }
        Output::Json | Output::Discovery { .. } => {
            // Assemble the list from the stored bytes without decoding them.
            let mut meta = serde_json::Map::new();
            meta.insert(
                "resourceVersion".into(),
                json!(out.resource_version.to_string()),
            );
            if let Some(c) = &out.continue_token {
                meta.insert("continue".into(), json!(c));
            }
            if let Some(r) = out.remaining {
                meta.insert("remainingItemCount".into(), json!(r));
            }
            let head = format!(
                "{{\"kind\":{},\"apiVersion\":{},\"metadata\":{},\"items\":[",
                Value::from(res.list_kind()),
                Value::from(res.api_version()),
                Value::Object(meta)
            );
            let mut buf = Vec::with_capacity(
                head.len() + out.items.iter().map(|b| b.len() + 1).sum::<usize>() + 2,
            );
            buf.extend_from_slice(head.as_bytes());
            for (i, item) in out.items.iter().enumerate() {
                if i > 0 {
                    buf.push(b',');
                }
                buf.extend_from_slice(item);
            }
            buf.extend_from_slice(b"]}");
            Ok(bytes_response(200, "application/json", Bytes::from(buf)))
        }
    }
}

/// A backend's response as the client gets it: its status, headers but
/// the hop-by-hop ones, and its body streamed through.
pub fn relayed(resp: Response<hyper::body::Incoming>) -> Result<Response<Body>, axum::http::Error> {
    let (parts, body) = resp.into_parts();
    let mut builder = Response::builder().status(parts.status);
    for (k, v) in &parts.headers {
        if k == header::CONNECTION || k == header::TRANSFER_ENCODING {
            continue;
        }
        builder = builder.header(k, v);
    }
    builder.body(Body::new(body))
}
