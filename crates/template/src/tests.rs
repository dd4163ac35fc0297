//! The renderer against the templates of issue 31 (recursive, exponential) and SwarmKit's placeholders.

use super::*;

fn data() -> Data {
    Data {
        service_id: "sid".into(),
        service_name: "web".into(),
        service_labels: [("tier".to_string(), "front".to_string())].into(),
        node_id: "nid".into(),
        node_hostname: "vm1".into(),
        node_os: "linux".into(),
        node_architecture: "x86_64".into(),
        task_id: "tid".into(),
        task_name: "web.2.tid".into(),
        task_slot: "2".into(),
    }
}

#[test]
fn swarmkit_placeholders_render() {
    let got = render_all(
        vec![
            "{{.Node.Hostname}}-{{.Task.Slot}}".into(),
            "{{.Service.Name}} {{.Service.ID}} {{index .Service.Labels \"tier\"}}".into(),
            "{{.Node.ID}} {{.Node.Platform.OS}}/{{.Node.Platform.Architecture}} {{.Task.ID}} {{.Task.Name}}".into(),
            "{{join \",\" \"a\" \"b\"}}".into(),
            "plain".into(),
        ],
        &data(),
        None,
        Limits::default(),
    )
    .unwrap();
    assert_eq!(got, ["vm1-2", "web sid front", "nid linux/x86_64 tid web.2.tid", "a,b", "plain"]);
    // The payload functions exist only with a payload.
    let e = render("{{env \"X\"}}", &data(), None, Limits::default()).unwrap_err();
    assert!(e.may_quote_text(), "{e:?}");
    let payload = Payload { env: [("X".to_string(), "1".to_string())].into(), ..Default::default() };
    assert_eq!(render("{{env \"X\"}}", &data(), Some(&payload), Limits::default()).unwrap(), "1");
}

#[test]
fn hostile_templates_are_refused_and_the_process_lives() {
    // Issue 31: recursion aborted the daemon with a stack overflow.
    let recursive = r#"{{define "a"}}{{template "a" .}}{{end}}{{template "a" .}}"#;
    let e = render(recursive, &data(), None, Limits::default()).unwrap_err();
    assert!(matches!(e, TemplateError::Recursion(_)), "{e:?}");
    assert!(check(recursive).is_err());
    // A 1.8 KB template doubling per definition was OOM-killed at 2 GiB.
    let mut exp = String::from(r#"{{define "l0"}}0123456789abcdef{{end}}"#);
    for i in 1..64 {
        exp.push_str(&format!(
            r#"{{{{define "l{i}"}}}}{{{{template "l{0}"}}}}{{{{template "l{0}"}}}}{{{{end}}}}"#,
            i - 1
        ));
    }
    exp.push_str(r#"{{template "l63"}}"#);
    let e = render(&exp, &data(), None, Limits::default()).unwrap_err();
    assert!(matches!(e, TemplateError::Limit(_)), "{e:?}");
    assert!(check(&exp).is_err());
    // Doubling a string with printf stops at the function budget.
    let doubling = format!("{{{{$x := \"ab\"}}}}{}{{{{len $x}}}}", "{{$x := printf \"%s%s\" $x $x}}".repeat(40));
    let e = render(&doubling, &data(), None, Limits::default()).unwrap_err();
    assert!(e.to_string().contains("produce more bytes"), "{e:?}");
    assert!(check(&doubling).is_ok(), "statically fine, stopped at render time");
    // A huge printf width.
    for f in [r#"{{printf "%0999999999d" 1}}"#, r#"{{printf "%.99999f" 1.0}}"#, r#"{{printf "%*d" 999999999 1}}"#] {
        let e = render(f, &data(), None, Limits::default()).unwrap_err();
        assert!(matches!(e, TemplateError::Limit(_)), "{f}: {e:?}");
    }
    // Output cap.
    let big = format!("{{{{range .Service.Labels}}}}{}{{{{end}}}}", "x".repeat(1000));
    let small = Limits { max_output_bytes: 500, ..Limits::default() };
    let e = render(&big, &data(), None, small).unwrap_err();
    assert!(e.to_string().contains("output is larger"), "{e:?}");
}

#[test]
fn the_deepest_template_allowed_renders_within_the_stack() {
    let limits = Limits::default();
    // Calls and nesting together at the depth limit: each body nests ifs and calls the next.
    let per = 7;
    let bodies = (limits.max_depth as usize) / (per + 1) - 1;
    let mut text = String::from(r#"{{define "d0"}}x{{end}}"#);
    for i in 1..=bodies {
        text.push_str(&format!(
            r#"{{{{define "d{i}"}}}}{}{{{{template "d{}" .}}}}{}{{{{end}}}}"#,
            "{{if 1}}".repeat(per),
            i - 1,
            "{{end}}".repeat(per)
        ));
    }
    text.push_str(&format!(r#"{{{{template "d{bodies}" .}}}}"#));
    assert_eq!(render(&text, &data(), None, limits).unwrap(), "x");
    let parens = format!("{{{{{}1{}}}}}", "(".repeat(40), ")".repeat(40));
    assert_eq!(render(&parens, &data(), None, limits).unwrap(), "1");
}

#[test]
fn long_flat_templates_do_not_recurse() {
    // Long pipelines, field chains and argument lists are flat: gtmpl walks them in loops.
    let pipeline = format!("{{{{1{}}}}}", " | printf \"%v\"".repeat(20_000));
    assert_eq!(render(&pipeline, &data(), None, Limits::default()).unwrap(), "1");
    let chain = format!("{{{{.Service{}}}}}", ".Name".repeat(20_000));
    assert!(render(&chain, &data(), None, Limits::default()).is_err());
    let args = format!("{{{{print{}}}}}", " 1".repeat(20_000));
    assert!(render(&args, &data(), None, Limits::default()).is_ok());
    let actions = "{{.Task.Slot}}".repeat(50_000);
    assert_eq!(render(&actions, &data(), None, Limits::default()).unwrap(), "2".repeat(50_000));
}

#[test]
fn else_if_chains_count_as_nesting() {
    let chain = |n: usize| format!("{{{{if false}}}}{}{{{{else}}}}z{{{{end}}}}", "{{else if false}}x".repeat(n));
    assert_eq!(render(&chain(40), &data(), None, Limits::default()).unwrap(), "z");
    let e = render(&chain(100_000), &data(), None, Limits::default()).unwrap_err();
    assert!(matches!(e, TemplateError::Limit(_)), "{e:?}");
}

#[test]
fn nested_definitions_count_as_nesting() {
    let nested = |n: usize| {
        let opens: String = (0..n).map(|i| format!("{{{{define \"d{i}\"}}}}")).collect();
        format!("{opens}{}ok", "{{end}}".repeat(n))
    };
    // The engine allows definitions at the top level only; the shape refuses a deep nest before it parses.
    let e = render(&nested(10), &data(), None, Limits::default()).unwrap_err();
    assert!(e.to_string().contains("unexpected define"), "{e:?}");
    let e = render(&nested(50_000), &data(), None, Limits::default()).unwrap_err();
    assert!(matches!(e, TemplateError::Limit(_)), "{e:?}");
}
