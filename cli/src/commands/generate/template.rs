//! Chat templates, rendered as Hugging Face `apply_chat_template` renders them: Jinja with
//! `trim_blocks` and `lstrip_blocks` on, loop controls, Python's string methods, the
//! `raise_exception` function and a `tojson` that writes what Python's `json.dumps` writes
//! (`", "` and `": "` separators, non-ASCII kept, nothing HTML-escaped). The context holds
//! `messages` (role and content, in that order), `add_generation_prompt`, `tools` and
//! `documents` (none) and the special tokens of the config by their names (`bos_token`, …).

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Value};
use std::fmt::Write;

/// One turn of a conversation.
pub struct Message {
    pub role: String,
    pub content: String,
}

/// `template` rendered over `messages`, with `specials` (name, text) in the context.
pub fn render(
    template: &str,
    messages: &[Message],
    specials: &[(String, String)],
    add_generation_prompt: bool,
) -> Result<String, String> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
        Err(Error::new(ErrorKind::InvalidOperation, msg))
    });
    env.add_filter("tojson", tojson);
    env.add_template("chat_template", template).map_err(|e| describe(&e))?;
    let messages: Vec<Value> = messages
        .iter()
        .map(|m| minijinja::context! { role => m.role.clone(), content => m.content.clone() })
        .collect();
    let mut ctx: Vec<(String, Value)> = vec![
        ("messages".into(), Value::from(messages)),
        ("add_generation_prompt".into(), Value::from(add_generation_prompt)),
        ("tools".into(), Value::from(())),
        ("documents".into(), Value::from(())),
    ];
    ctx.extend(specials.iter().map(|(k, v)| (k.clone(), Value::from(v.clone()))));
    let ctx: Value = ctx.into_iter().collect();
    let t = env.get_template("chat_template").map_err(|e| describe(&e))?;
    t.render(ctx).map_err(|e| describe(&e))
}

/// A template error with its line, as Jinja reports one.
fn describe(e: &Error) -> String {
    let mut s = match e.kind() {
        // `raise_exception("…")`: the template's own words.
        ErrorKind::InvalidOperation => e.detail().unwrap_or("").to_string(),
        _ => e.to_string(),
    };
    if let Some(line) = e.line() {
        s = format!("{s} (line {line} of the chat template)");
    }
    s
}

/// `tojson(indent=None)` as Python's `json.dumps(x, ensure_ascii=False, indent=indent)`.
fn tojson(v: Value, kwargs: Kwargs) -> Result<String, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    dump(&v, indent, 0, &mut out)?;
    Ok(out)
}

fn dump(v: &Value, indent: Option<usize>, level: usize, out: &mut String) -> Result<(), Error> {
    // json.dumps puts each item on its own line with an indent, after ", " without one.
    let newline = |out: &mut String, level: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * level));
        }
    };
    let sep = if indent.is_some() { "," } else { ", " };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => write!(out, "{v}").expect("a String takes writes"),
        ValueKind::String => {
            out.push_str(&serde_json::to_string(v.as_str().unwrap_or("")).unwrap())
        }
        ValueKind::Map => {
            out.push('{');
            for (i, k) in v.try_iter()?.enumerate() {
                out.push_str(if i > 0 { sep } else { "" });
                newline(out, level + 1);
                dump(&Value::from(k.to_string()), None, 0, out)?;
                out.push_str(": ");
                dump(&v.get_item(&k)?, indent, level + 1, out)?;
            }
            if v.len().is_some_and(|n| n > 0) {
                newline(out, level);
            }
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            let items: Vec<Value> = v.try_iter()?.collect();
            for (i, item) in items.iter().enumerate() {
                out.push_str(if i > 0 { sep } else { "" });
                newline(out, level + 1);
                dump(item, indent, level + 1, out)?;
            }
            if !items.is_empty() {
                newline(out, level);
            }
            out.push(']');
        }
        k => return Err(Error::new(ErrorKind::InvalidOperation, format!("cannot tojson a {k}"))),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(content: &str) -> Vec<Message> {
        vec![Message { role: "user".into(), content: content.into() }]
    }

    #[test]
    fn blocks_are_trimmed_as_hugging_face_renders_them() {
        let t = "{% for m in messages %}\n    {% if m.role == 'user' %}\n<{{ m.content }}>\n\
                 {% endif %}\n{% endfor %}{% if add_generation_prompt %}A:{% endif %}";
        assert_eq!(render(t, &user("hi"), &[], true).unwrap(), "<hi>\nA:");
        assert_eq!(render(t, &user("hi"), &[], false).unwrap(), "<hi>\n");
    }

    #[test]
    fn python_methods_exceptions_and_loop_controls_work() {
        let specials = [("bos_token".to_string(), "<s>".to_string())];
        let t = "{{ bos_token }}{% for m in messages %}{% if loop.index > 1 %}{% break %}\
                 {% endif %}{{ m.content.strip().upper() }}{% endfor %}";
        assert_eq!(render(t, &user("  hey "), &specials, true).unwrap(), "<s>HEY");
        let t = "{% if messages[0].role != 'system' %}{{ raise_exception('need a system') }}\
                 {% endif %}";
        assert_eq!(
            render(t, &user("x"), &[], true).unwrap_err(),
            "need a system (line 1 of the chat template)"
        );
        let e = render("{% for %}", &user("x"), &[], true).unwrap_err();
        assert!(e.contains("line 1"), "{e}");
    }

    /// Templates in the styles of Llama 3, Mistral and others over several conversations, as
    /// `transformers` renders them (tests/fixtures/generate/templates.py wrote them).
    #[test]
    fn templates_render_as_transformers_renders_them() {
        let path =
            concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/generate/templates.json");
        let fixture: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let specials = [("bos_token", "<|endoftext|>"), ("eos_token", "<|im_end|>")];
        let specials: Vec<(String, String)> =
            specials.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let cases = fixture["cases"].as_array().unwrap();
        assert_eq!(cases.len(), 18);
        for case in cases {
            let template = fixture["templates"][case["template"].as_str().unwrap()].as_str();
            let conversation = &fixture["conversations"][case["conversation"].as_str().unwrap()];
            let messages: Vec<Message> = (conversation.as_array().unwrap().iter())
                .map(|m| Message {
                    role: m["role"].as_str().unwrap().into(),
                    content: m["content"].as_str().unwrap().into(),
                })
                .collect();
            let gen = case["add_generation_prompt"].as_bool().unwrap();
            let got = render(template.unwrap(), &messages, &specials, gen)
                .unwrap_or_else(|e| panic!("{}: {e}", case["template"]));
            assert_eq!(
                got,
                case["text"].as_str().unwrap(),
                "{} {}",
                case["template"],
                case["conversation"]
            );
        }
    }

    #[test]
    fn tojson_writes_what_python_json_dumps_writes() {
        let t = "{{ messages | tojson }}|{{ messages[0] | tojson(indent=2) }}|{{ tools | tojson }}";
        let got = render(t, &user("é <b> \"q\"\n"), &[], false).unwrap();
        assert_eq!(
            got,
            "[{\"role\": \"user\", \"content\": \"é <b> \\\"q\\\"\\n\"}]|{\n  \"role\": \
             \"user\",\n  \"content\": \"é <b> \\\"q\\\"\\n\"\n}|null"
        );
    }
}
