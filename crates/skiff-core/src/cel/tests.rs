//! Tests of the CEL environment and Kubernetes' libraries.

use serde_json::json;

use super::compile;

#[test]
fn an_expression_sees_its_json_variables() {
    let p = compile("object.spec.replicas > 2", &["object"]).unwrap();
    assert_eq!(
        p.eval(&[("object", &json!({"spec": {"replicas": 3}}))])
            .unwrap(),
        json!(true)
    );
}

use serde_json::Value;

fn eval(expr: &str) -> Result<Value, String> {
    compile(expr, &[])?.eval(&[])
}

fn check(cases: &[(&str, Value)]) {
    for (expr, want) in cases {
        assert_eq!(eval(expr).as_ref(), Ok(want), "{expr}");
    }
}

#[test]
fn list_library() {
    check(&[
        ("[1, 2, 3].isSorted()", json!(true)),
        ("['b', 'a'].isSorted()", json!(false)),
        ("[1, 2, 3].sum()", json!(6)),
        ("[1.5, 2.5].sum()", json!(4.0)),
        ("[].sum()", json!(0)),
        ("[3, 1, 2].min()", json!(1)),
        ("[3, 1, 2].max()", json!(3)),
        ("['a', 'b', 'a'].indexOf('a')", json!(0)),
        ("['a', 'b', 'a'].lastIndexOf('a')", json!(2)),
        ("[1, 2].indexOf(5)", json!(-1)),
    ]);
    assert!(eval("[].min()").is_err());
}

#[test]
fn regex_library() {
    check(&[
        ("'abc 123'.find('[0-9]+')", json!("123")),
        ("'abc'.find('[0-9]+')", json!("")),
        ("'a1b2c3'.findAll('[0-9]')", json!(["1", "2", "3"])),
        ("'a1b2c3'.findAll('[0-9]', 2)", json!(["1", "2"])),
        ("'abc'.matches('^a')", json!(true)),
    ]);
}

#[test]
fn url_library() {
    check(&[
        (
            "isURL('https://example.com:8080/a/b?x=1&x=2&y=3')",
            json!(true),
        ),
        ("isURL('not a url')", json!(false)),
        (
            "url('https://example.com:8080/a/b').getScheme()",
            json!("https"),
        ),
        (
            "url('https://example.com:8080/a/b').getHost()",
            json!("example.com:8080"),
        ),
        (
            "url('https://example.com:8080/a/b').getHostname()",
            json!("example.com"),
        ),
        (
            "url('https://example.com:8080/a/b').getPort()",
            json!("8080"),
        ),
        ("url('https://[::1]:80/').getHostname()", json!("::1")),
        (
            "url('https://example.com/a/b').getEscapedPath()",
            json!("/a/b"),
        ),
        (
            "url('https://example.com/?x=1&x=2&y=3').getQuery()",
            json!({"x": ["1", "2"], "y": ["3"]}),
        ),
        (
            "url('/absolute/path').getEscapedPath()",
            json!("/absolute/path"),
        ),
    ]);
    assert!(eval("url('relative')").is_err());
}

#[test]
fn quantity_library() {
    check(&[
        ("isQuantity('500m')", json!(true)),
        ("isQuantity('1.5Gi')", json!(true)),
        ("isQuantity('five')", json!(false)),
        ("quantity('1Gi').compareTo(quantity('1024Mi'))", json!(0)),
        ("quantity('1').isGreaterThan(quantity('999m'))", json!(true)),
        ("quantity('100m').isLessThan(quantity('1'))", json!(true)),
        ("quantity('1.5Gi').asInteger()", json!(1610612736)),
        ("quantity('1500m').isInteger()", json!(false)),
        ("quantity('2k').asApproximateFloat()", json!(2000.0)),
        ("quantity('-5').sign()", json!(-1)),
        (
            "quantity('500m').add(quantity('500m')).asInteger()",
            json!(1),
        ),
        ("quantity('2').sub(1).asInteger()", json!(1)),
        ("quantity('1').add(quantity('250m'))", json!("1250m")),
        ("quantity('1Gi') == quantity('1024Mi')", json!(true)),
    ]);
    assert!(eval("quantity('1500m').asInteger()").is_err());
    assert!(eval("quantity('x')").is_err());
}

#[test]
fn strings_library_and_macros() {
    check(&[
        ("'Hello'.lowerAscii()", json!("hello")),
        ("'Hello'.upperAscii()", json!("HELLO")),
        ("'a-b-c'.replace('-', '.')", json!("a.b.c")),
        ("'a,b'.split(',')", json!(["a", "b"])),
        ("['a', 'b'].join('/')", json!("a/b")),
        ("'  x '.trim()", json!("x")),
        ("'hello'.indexOf('l')", json!(2)),
        ("'hello'.lastIndexOf('l')", json!(3)),
        ("'hello'.substring(1, 3)", json!("el")),
        ("'hello'.charAt(1)", json!("e")),
        ("[1, 2, 3].all(x, x > 0)", json!(true)),
        ("[1, 2, 3].exists(x, x > 2)", json!(true)),
        ("[1, 2, 3].exists_one(x, x > 1)", json!(false)),
        ("[1, 2, 3].map(x, x * 2)", json!([2, 4, 6])),
        ("[1, 2, 3].filter(x, x != 2)", json!([1, 3])),
        ("has({'a': 1}.a)", json!(true)),
        ("{'a': 1}.a + 1", json!(2)),
    ]);
}

#[test]
fn admission_variables_bind_by_name() {
    let p = compile(
        "object.metadata.name.startsWith(params.prefix) && request.operation == 'CREATE' && !has(oldObject.spec)",
        &["object", "oldObject", "request", "params"],
    )
    .unwrap();
    let out = p.eval(&[
        ("object", &json!({"metadata": {"name": "team-a"}})),
        ("oldObject", &json!({})),
        ("request", &json!({"operation": "CREATE"})),
        ("params", &json!({"prefix": "team-"})),
    ]);
    assert_eq!(out, Ok(json!(true)));
    assert!(p.reads("params") && !p.reads("variables"));
    // a variable the expression reads but the caller did not bind
    let missing = p.eval(&[("object", &json!({}))]);
    assert!(missing.unwrap_err().contains("no such attribute"));
}

#[test]
fn compile_errors_name_the_problem() {
    let e = compile("object.x ==", &["object"]).unwrap_err();
    assert!(e.starts_with("compilation failed: "), "{e}");
    let e = compile("nope.x == 1", &["object"]).unwrap_err();
    assert_eq!(
        e,
        "compilation failed: ERROR: <input>:1:1: undeclared reference to 'nope' (in container '')"
    );
    assert!(compile("", &[]).is_err());
    assert!(compile(&"(".repeat(10_000), &[]).is_err());
}

#[test]
fn runtime_cost_is_bounded_by_the_values_sizes() {
    let p = compile(
        "object.a.all(x, object.a.all(y, x != y || x == y))",
        &["object"],
    )
    .unwrap();
    let small: Vec<i64> = (0..10).collect();
    assert_eq!(p.eval(&[("object", &json!({"a": small}))]), Ok(json!(true)));
    let big: Vec<i64> = (0..5000).collect();
    let e = p.eval(&[("object", &json!({"a": big}))]).unwrap_err();
    assert!(e.contains("cost limit exceeded"), "{e}");
}

#[test]
fn property_escaping_matches_kubernetes() {
    use super::escape_property;
    assert_eq!(escape_property("foo").as_deref(), Some("foo"));
    assert_eq!(escape_property("x-y").as_deref(), Some("x__dash__y"));
    assert_eq!(
        escape_property("a.b/c").as_deref(),
        Some("a__dot__b__slash__c")
    );
    assert_eq!(
        escape_property("a__b").as_deref(),
        Some("a__underscores__b")
    );
    assert_eq!(
        escape_property("namespace").as_deref(),
        Some("__namespace__")
    );
    assert_eq!(escape_property("1abc"), None);
}
