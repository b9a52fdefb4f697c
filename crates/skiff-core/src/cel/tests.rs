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

#[test]
fn format_library() {
    check(&[
        (
            "format.dns1123Label().validate('my-name').hasValue()",
            json!(false),
        ),
        (
            "format.dns1123Label().validate('My_Name').hasValue()",
            json!(true),
        ),
        (
            "format.dns1123Subdomain().validate('apiextensions.k8s.io').hasValue()",
            json!(false),
        ),
        (
            "format.dns1035Label().validate('1abc').hasValue()",
            json!(true),
        ),
        (
            "format.qualifiedName().validate('apiextensions.k8s.io/v1beta1').hasValue()",
            json!(false),
        ),
        (
            "format.dns1123LabelPrefix().validate('my-prefix-').hasValue()",
            json!(false),
        ),
        ("format.labelValue().validate('').hasValue()", json!(false)),
        (
            "format.uuid().validate('123e4567-e89b-12d3-a456-426614174000').hasValue()",
            json!(false),
        ),
        (
            "format.date().validate('2021-13-01').hasValue()",
            json!(true),
        ),
        ("format.named('dns1123Label').hasValue()", json!(true)),
        ("format.named('nope').hasValue()", json!(false)),
    ]);
    let e = eval("format.dns1123Label().validate('x'.repeat(64) + '_').value()");
    // `repeat` is not a CEL function: an error, never a panic
    assert!(e.is_err());
    assert_eq!(
        eval("format.dns1123Label().validate('A').value()"),
        Ok(json!(["a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"]))
    );
}

#[test]
fn ip_and_cidr_libraries() {
    check(&[
        ("isIP('10.0.0.1')", json!(true)),
        ("isIP('::1')", json!(true)),
        ("isIP('::ffff:1.2.3.4')", json!(false)),
        ("isIP('fe80::1%eth0')", json!(false)),
        ("isIP('example.com')", json!(false)),
        ("ip('10.0.0.1').family()", json!(4)),
        ("ip('::1').family()", json!(6)),
        ("ip('127.0.0.1').isLoopback()", json!(true)),
        ("ip('0.0.0.0').isUnspecified()", json!(true)),
        ("ip('169.254.1.1').isLinkLocalUnicast()", json!(true)),
        ("ip('8.8.8.8').isGlobalUnicast()", json!(true)),
        ("ip.isCanonical('2001:db8::1')", json!(true)),
        ("ip.isCanonical('2001:DB8::1')", json!(false)),
        ("ip('10.0.0.1') == ip('10.0.0.1')", json!(true)),
        ("string(ip('10.0.0.1'))", json!("10.0.0.1")),
        ("isCIDR('10.0.0.0/8')", json!(true)),
        ("isCIDR('10.0.0.0/33')", json!(false)),
        ("cidr('10.0.0.0/8').containsIP(ip('10.1.2.3'))", json!(true)),
        ("cidr('10.0.0.0/8').containsIP('11.1.2.3')", json!(false)),
        (
            "cidr('10.0.0.0/8').containsCIDR('10.1.0.0/16')",
            json!(true),
        ),
        (
            "cidr('10.1.0.0/16').containsCIDR('10.0.0.0/8')",
            json!(false),
        ),
        (
            "cidr('10.1.2.3/8').masked() == cidr('10.0.0.0/8')",
            json!(true),
        ),
        ("cidr('10.1.2.3/8').prefixLength()", json!(8)),
        ("string(cidr('10.1.2.3/8').ip())", json!("10.1.2.3")),
        (
            "string(cidr('2001:db8::1/32').masked())",
            json!("2001:db8::/32"),
        ),
    ]);
    assert!(eval("ip('nope')").is_err());
}

#[test]
fn semver_and_sets_libraries() {
    check(&[
        ("isSemver('1.2.3')", json!(true)),
        ("isSemver('v1.2')", json!(false)),
        ("isSemver('v1.2', true)", json!(true)),
        ("semver('1.2.3').major()", json!(1)),
        ("semver('1.2.3').minor()", json!(2)),
        ("semver('1.2.3').patch()", json!(3)),
        ("semver('1.2.3').isLessThan(semver('1.10.0'))", json!(true)),
        (
            "semver('1.0.0-alpha').isLessThan(semver('1.0.0'))",
            json!(true),
        ),
        (
            "semver('1.0.0-alpha.2').compareTo(semver('1.0.0-alpha.10'))",
            json!(-1),
        ),
        (
            "semver('2.0.0').isGreaterThan(semver('1.9.9'))",
            json!(true),
        ),
        ("semver('v1.2', true).compareTo(semver('1.2.0'))", json!(0)),
        ("sets.contains([1, 2, 3], [2, 3])", json!(true)),
        ("sets.contains([1, 2], [3])", json!(false)),
        ("sets.equivalent([1, 2, 2], [2, 1])", json!(true)),
        ("sets.intersects([1, 2], [2, 5])", json!(true)),
        ("sets.intersects([1], [])", json!(false)),
    ]);
    assert!(eval("semver('nope')").is_err());
}

#[test]
fn long_and_deep_expressions_are_refused_or_run_without_overflowing() {
    for expr in [
        format!("{}1", "1 + ".repeat(20_000)),
        format!("{}true", "!".repeat(20_000)),
        format!("{}1{}", "[".repeat(200), "]".repeat(200)),
        format!("self{}", ".a".repeat(20_000)),
        format!("{}1", "-".repeat(20_000)),
        "a || ".repeat(20_000) + "a",
    ] {
        if let Ok(p) = compile(&expr, &["self", "a"]) {
            let _ = p.eval(&[("self", &json!({})), ("a", &json!(true))]);
        }
    }
}

#[test]
fn the_deepest_accepted_expression_evaluates_on_a_small_stack() {
    // Just under the limits: accepted, and evaluating it fits a 2 MiB stack
    // (a server thread's); deeper is refused.
    let on_small_stack = |p: super::Program| {
        std::thread::Builder::new()
            .stack_size(2 * 1024 * 1024)
            .spawn(move || p.eval(&[]))
            .unwrap()
            .join()
            .unwrap()
    };
    let lists = format!("{}1{}", "[".repeat(90), "]".repeat(90));
    assert!(on_small_stack(compile(&lists, &[]).expect("accepted")).is_ok());
    let sums = format!("{}1", "1 + ".repeat(super::MAX_DEPTH - 2));
    assert!(on_small_stack(compile(&sums, &[]).expect("accepted")).is_ok());
    let e = compile(&format!("{}1", "1 + ".repeat(super::MAX_DEPTH + 1)), &[]).unwrap_err();
    assert!(e.contains("max recursion depth exceeded"), "{e}");
    let e = compile(&format!("{}1{}", "[".repeat(200), "]".repeat(200)), &[]).unwrap_err();
    assert!(e.starts_with("compilation failed: ERROR: <input>:"), "{e}");
}

#[test]
fn random_expressions_never_panic() {
    let tokens = [
        "self",
        "a",
        "1",
        "-1",
        "0",
        "1.5",
        "'x'",
        "\"\"",
        "b'x'",
        "true",
        "null",
        "[",
        "]",
        "{",
        "}",
        "(",
        ")",
        ",",
        ".",
        ":",
        "?",
        "+",
        "-",
        "*",
        "/",
        "%",
        "==",
        "!=",
        "<",
        ">=",
        "&&",
        "||",
        "!",
        "in",
        "size(",
        "has(",
        ".all(x,",
        ".map(x,",
        ".filter(x,",
        ".exists_one(x,",
        "x",
        "int(",
        "string(",
        "double(",
        "duration(",
        "timestamp(",
        "'1s'",
        "quantity(",
        "'1Gi'",
        "url(",
        "'http://a/b'",
        ".substring(",
        ".charAt(",
        ".split(",
        ".join(",
        ".lowerAscii()",
        ".matches(",
        "'['",
        ".isSorted()",
        ".sum()",
        ".min()",
        ".max()",
        ".indexOf(",
        "ip(",
        "'::1'",
        "cidr(",
        "'1.2.3.4/8'",
        ".containsIP(",
        "format.dns1123Label()",
        ".validate(",
        "semver(",
        "'1.2.3'",
        ".compareTo(",
        "9223372036854775807",
        "-9223372036854775808",
        "18446744073709551615u",
        ".?a",
        "[?",
        "optional.of(",
        ".value()",
        ".orValue(",
        "sets.contains(",
        "[1,2]",
        "{'a':1}",
        ".a",
        "[0]",
        "[-1]",
        "[99]",
    ];
    let mut state: u64 = 0x9E3779B97F4A7C15;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let vars = [
        (
            "self",
            json!({"a": [1, 2, {"b": "c"}], "s": "text", "n": 1.5}),
        ),
        ("a", json!(["x", "y"])),
    ];
    for _ in 0..4000 {
        let len = 1 + next() % 12;
        let expr: String = (0..len)
            .map(|_| tokens[(next() % tokens.len() as u64) as usize])
            .collect::<Vec<_>>()
            .join(" ");
        if let Ok(p) = compile(&expr, &["self", "a"]) {
            let bound: Vec<(&str, &serde_json::Value)> =
                vars.iter().map(|(n, v)| (*n, v)).collect();
            let _ = p.eval(&bound);
        }
    }
}

#[test]
fn variables_used_whole_or_by_field_evaluate_the_same() {
    let obj = json!({"metadata": {"name": "a", "labels": {"x": "1"}}, "spec": {"n": [1, 2, 3]}});
    let old = json!({"metadata": {"name": "a"}, "spec": {"n": [1, 2]}});
    for (expr, want) in [
        (
            "object.metadata.name == oldObject.metadata.name",
            json!(true),
        ),
        ("object == oldObject", json!(false)),
        (
            "object.spec.n.all(x, x > 0) && size(object.spec.n) == 3",
            json!(true),
        ),
        (
            "'x' in object.metadata.labels && !has(oldObject.metadata.labels)",
            json!(true),
        ),
        (
            "size(object) == 2 && object.spec.n.map(object, object * 2) == [2, 4, 6]",
            json!(true),
        ),
        ("[object.metadata, oldObject.spec].size() == 2", json!(true)),
    ] {
        let p = compile(expr, &["object", "oldObject"]).unwrap();
        assert_eq!(
            p.eval(&[("object", &obj), ("oldObject", &old)]),
            Ok(want),
            "{expr}"
        );
    }
}

#[test]
fn the_nastiest_short_expressions_parse_on_a_small_stack() {
    // Under 512 bytes an expression is parsed on the caller's thread: the
    // deepest such inputs must fit a 2 MiB stack.
    let out = std::thread::Builder::new()
        .stack_size(2 * 1024 * 1024)
        .spawn(|| {
            for expr in [
                format!("{}1", "1+".repeat(255)),
                format!("{}true", "!".repeat(508)),
                format!("{}1", "-".repeat(510)),
                format!("{}1{}", "(".repeat(255), ")".repeat(255)),
                format!("{}1{}", "[".repeat(255), "]".repeat(255)),
                format!("a{}", ".b".repeat(255)),
                format!("{}a", "a||".repeat(170)),
                format!("{}1{}", "f(".repeat(170), ")".repeat(170)),
            ] {
                assert!(expr.len() <= 512);
                if let Ok(p) = compile(&expr, &["a"]) {
                    let _ = p.eval(&[("a", &json!(true))]);
                }
            }
        })
        .unwrap()
        .join();
    assert!(out.is_ok());
}

#[test]
fn optional_results_are_their_value_or_null() {
    check(&[
        ("optional.of(1)", json!(1)),
        ("optional.none()", json!(null)),
        ("{'a': 1}.?a", json!(1)),
        ("{'a': 1}.?b.orValue(2)", json!(2)),
    ]);
}

#[test]
fn two_variable_comprehensions_see_index_or_key_and_value() {
    check(&[
        ("[1, 2, 3].all(i, v, v == i + 1)", json!(true)),
        ("[1, 2, 3].all(i, v, v > i + 1)", json!(false)),
        ("{'a': 1, 'b': 2}.all(k, v, k != '' && v > 0)", json!(true)),
        (
            "{'a': 1, 'b': 2}.exists(k, v, k == 'b' && v == 2)",
            json!(true),
        ),
        (
            "{'a': 1, 'b': 2}.exists(k, v, k == 'b' && v == 1)",
            json!(false),
        ),
        ("[5, 6, 7].existsOne(i, v, i == 1 && v == 6)", json!(true)),
        ("[5, 5].existsOne(i, v, v == 5)", json!(false)),
        ("[5, 6].exists_one(i, v, v == 5)", json!(true)),
        ("[1, 2].transformList(i, v, v * 10 + i)", json!([10, 21])),
        ("[1, 2, 3].transformList(i, v, i > 0, v)", json!([2, 3])),
        ("{'a': 1}.transformList(k, v, k + string(v))", json!(["a1"])),
        (
            "{'a': 1, 'b': 2}.transformMap(k, v, v + 1)",
            json!({"a": 2, "b": 3}),
        ),
        (
            "{'a': 1, 'b': 2}.transformMap(k, v, k == 'a', v)",
            json!({"a": 1}),
        ),
        (
            "['x', 'y'].transformMap(i, v, v + string(i))",
            json!({"0": "x0", "1": "y1"}),
        ),
        (
            "['x', 'y'].transformMapEntry(i, v, {v: i})",
            json!({"x": 0, "y": 1}),
        ),
        (
            "{'a': 1, 'b': 2}.transformMapEntry(k, v, v > 1, {k + k: v})",
            json!({"bb": 2}),
        ),
        ("[].all(i, v, false)", json!(true)),
        ("{}.exists(k, v, true)", json!(false)),
    ]);
}

#[test]
fn two_variable_comprehensions_nest_and_shadow_as_cel_scopes_do() {
    check(&[
        // The inner comprehension's own variables.
        ("[[1, 2], [3]].all(i, v, v.all(j, w, w > i))", json!(true)),
        ("[[1, 2], [0]].all(i, v, v.all(j, w, w > i))", json!(false)),
        // An inner one-variable comprehension rebinding the index name.
        (
            "[1, 2].all(i, v, [10].all(i, i == 10) && v == i + 1)",
            json!(true),
        ),
        // An inner two-variable one rebinding both names.
        (
            "{'a': [7]}.all(k, v, v.all(k, v, k == 0 && v == 7))",
            json!(true),
        ),
        // The outer names reach into inner macros that do not rebind them.
        (
            "{'a': [1, 2]}.all(k, v, v.exists(x, x == size(v)) && k == 'a')",
            json!(true),
        ),
        // The target is evaluated once, whatever it is.
        ("[1, 2].transformList(i, v, v)[1]", json!(2)),
    ]);
    // cel-go's wording for a transformMapEntry that builds a key twice.
    let e = eval("[1, 1].transformMapEntry(i, v, {'k': v})").unwrap_err();
    assert!(e.contains("insert failed: key k already exists"), "{e}");
    // Names must be simple and distinct.
    assert!(compile("[1].all(i, i, true)", &[]).is_err());
    assert!(compile("[1].all(i.x, v, true)", &[]).is_err());
}

#[test]
fn undeclared_functions_are_found_before_evaluation() {
    for (expr, name) in [
        ("foo(1) == 1", "foo"),
        ("self.a.foo()", "foo"),
        ("strings.nope('a') == 'a'", "nope"),
        ("[1].map(x, bar(x)) == [1]", "bar"),
        ("self.all(x, x.baz())", "baz"),
    ] {
        let p = compile(expr, &["self"]).unwrap();
        let e = p.undeclared_function().unwrap_or_default();
        assert!(
            e.starts_with("ERROR: <input>:")
                && e.ends_with(&format!(
                    ": undeclared reference to '{name}' (in container '')"
                )),
            "{expr}: {e}"
        );
    }
    // What real CRDs call is declared.
    let mut refused = Vec::new();
    for expr in [
        "self.a.startsWith('x') && self.a.endsWith('y') && self.a.contains('z')",
        "self.a.matches('^a') && size(self.a) > 0 && self.a.size() > 0",
        "self.a.lowerAscii() == self.a.upperAscii().lowerAscii()",
        "self.a.split(',').size() > 0 && self.a.replace('a', 'b') != '' && self.a.trim() != ''",
        "self.a.indexOf('a') >= 0 && self.a.substring(1) != '' && self.a.charAt(0) != ''",
        "['a'].join(',') == 'a' && self.a.lastIndexOf('a') >= 0",
        "quantity(self.q).isLessThan(quantity('1Gi')) && isQuantity(self.q)",
        "quantity(self.q).compareTo(quantity('1')) > 0 && quantity(self.q).asInteger() > 0",
        "url(self.u).getHost() != '' && isURL(self.u) && url(self.u).getScheme() == 'https'",
        "self.l.isSorted() && self.l.sum() > 0 && self.l.min() < self.l.max()",
        "self.l.indexOf(1) >= 0 && self.l.all(i, v, v > i)",
        "duration(self.d) > duration('1s') && timestamp(self.t) < timestamp('2030-01-01T00:00:00Z')",
        "int(self.n) + 1 > uint(1) && double(self.n) > 0.0 && string(self.n) != ''",
        "type(self) == map && dyn(self.n) == 1",
        "self.a.find('[0-9]+') != '' && self.a.findAll('[0-9]').size() > 0",
        "isIP(self.ip) && ip(self.ip).family() == 4 && isCIDR(self.c) && cidr(self.c).containsIP(self.ip)",
        "optional.of(1).hasValue() && optional.none().orValue(2) == 2 && self.?a.orValue('') != ''",
        "sets.contains([1, 2], [1]) && sets.intersects([1], [1])",
        "isSemver(self.v) && semver(self.v).major() >= 0",
        "self.a.format([]) == self.a && strings.quote(self.a) != ''",
        "lists.range(3).size() == 3 && [3, 1].sort()[0] == 1 && [[1], [2]].flatten().size() == 2",
        "[1, 1].distinct().size() == 1 && [1, 2, 3].slice(0, 1).size() == 1",
    ] {
        let p = compile(expr, &["self"]).unwrap_or_else(|e| panic!("{expr}: {e}"));
        if let Some(e) = p.undeclared_function() {
            refused.push(format!("{expr}: {e}"));
        }
    }
    assert!(refused.is_empty(), "{refused:#?}");
}
