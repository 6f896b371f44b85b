//! Which engine the replicas run and whether it schedules by priority
//! (issue #51 item 3): each request's class becomes the engine's own
//! `priority` ([`onepool_router::engine_priority`]) where it does. Read
//! from `[endpoint.priority]` and the replicas' command; `onepoold --check`
//! (and through it `onepool doctor`) says when the command lacks the
//! engine's flag.

use onepool_router::classes::{Rank, RequestClasses};
use onepool_router::engine_priority::{Engine, EnginePriority};

use crate::config::{command_words, EndpointConfig, EngineChoice};

/// An engine that schedules by priority, as its command line shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub name: &'static str,
    /// The flag that turns its priority scheduling on.
    pub flag: &'static str,
    pub on: bool,
    pub scale: Engine,
}

/// The engine a replica command runs (SGLang or vLLM), with its flags.
pub fn seen_in(command: &str) -> Option<Seen> {
    let words: Vec<&str> = command_words(command).collect();
    let has = |flag: &str| words.iter().any(|w| *w == flag || w.strip_prefix(flag).is_some_and(|r| r.starts_with('=')));
    let runs = |name: &str| words.iter().any(|w| w.split(['/', '.']).any(|part| part == name));
    if runs("sglang") {
        let low_first = has("--schedule-low-priority-values-first");
        return Some(Seen {
            name: "SGLang",
            flag: "--enable-priority-scheduling",
            on: has("--enable-priority-scheduling"),
            scale: if low_first { Engine::LowerFirst } else { Engine::HigherFirst },
        });
    }
    if runs("vllm") {
        let on = words.windows(2).any(|w| w[0] == "--scheduling-policy" && w[1] == "priority")
            || words.contains(&"--scheduling-policy=priority");
        return Some(Seen { name: "vLLM", flag: "--scheduling-policy priority", on, scale: Engine::LowerFirst });
    }
    None
}

fn command(e: &EndpointConfig) -> Option<&str> {
    e.replicas.as_ref().map(|r| r.command.as_str())
}

/// The engine and scale the endpoint's requests are told, if any.
fn chosen(e: &EndpointConfig) -> Option<(&'static str, Engine)> {
    let seen = command(e).and_then(seen_in);
    match e.engine_priority.engine {
        EngineChoice::Off => None,
        EngineChoice::Auto => seen.filter(|s| s.on).map(|s| (s.name, s.scale)),
        EngineChoice::Sglang => Some(("SGLang", seen.map_or(Engine::HigherFirst, |s| s.scale))),
        EngineChoice::Vllm => Some(("vLLM", Engine::LowerFirst)),
    }
}

/// Each class's value for the endpoint's engine, or `None` when its
/// requests carry no priority. A value for a class the endpoint lacks, or
/// values on an endpoint without classes, are errors where written.
pub fn resolve(e: &EndpointConfig, classes: Option<&RequestClasses>) -> Result<Option<EnginePriority>, String> {
    let Some(classes) = classes else {
        return match e.engine_priority.values.first() {
            Some((_, _, at)) => Err(format!("{at}: endpoint {:?} has no request classes to give values", e.name)),
            None => Ok(None),
        };
    };
    let mut own = Vec::new();
    for (class, value, at) in &e.engine_priority.values {
        let Some(rank) = classes.rank(class) else {
            let known: Vec<&str> = classes.all().map(|(n, _)| n).collect();
            return Err(format!("{at}: {class:?} is not a request class of the endpoint ({})", known.join(", ")));
        };
        own.push((rank, i64::from(*value)));
    }
    let Some((_, scale)) = chosen(e) else { return Ok(None) };
    let ranks: Vec<Rank> = classes.all().map(|(_, r)| r).collect();
    Ok(Some(EnginePriority::new(scale, &ranks, &own)))
}

/// What `onepoold --check` warns of: an engine whose priority scheduling
/// the command does not turn on.
pub fn warnings(e: &EndpointConfig) -> Vec<String> {
    let Some(seen) = command(e).and_then(seen_in) else {
        return match (e.engine_priority.engine, command(e)) {
            (EngineChoice::Sglang | EngineChoice::Vllm, Some(_)) => vec![format!(
                "endpoint {:?} [endpoint.priority]: engine = {:?} but the replicas' command runs neither SGLang nor vLLM as far as it shows; requests carry a priority the server may refuse",
                e.name,
                format!("{:?}", e.engine_priority.engine).to_lowercase()
            )],
            _ => Vec::new(),
        };
    };
    if seen.on || e.engine_priority.engine == EngineChoice::Off {
        return Vec::new();
    }
    let consequence = match (e.engine_priority.engine, seen.name) {
        (EngineChoice::Auto, _) => "so onepool sends it no priority, and a live request waits behind agents' requests the engine already runs",
        (_, "vLLM") => "and vLLM refuses a request whose priority is not 0 without it: requests of every class but the first will fail",
        _ => "so it ignores the priority onepool sends",
    };
    vec![format!(
        "endpoint {:?} [endpoint.replicas] command: it runs {} without {}, {consequence}; add {} to the command",
        e.name, seen.name, seen.flag, seen.flag
    )]
}

/// The endpoint's engine priority, in a line for `onepoold --check`.
pub fn summary(e: &EndpointConfig, classes: &RequestClasses) -> String {
    let (Some((name, _)), Some(p)) = (chosen(e), classes.engine_priority()) else {
        return format!("endpoint {:?}: none sent to the engine", e.name);
    };
    let each: Vec<String> = p
        .values()
        .map(|(rank, v)| {
            let names: Vec<&str> = classes.all().filter(|(_, r)| *r == rank).map(|(n, _)| n).collect();
            format!("{} {v}", names.join("/"))
        })
        .collect();
    format!("endpoint {:?}: each request's class as {name}'s `priority`: {}", e.name, each.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engine_and_its_flag_are_read_from_the_command() {
        let s = seen_in("python3 -m sglang.launch_server --model-path m --port $ONEPOOL_BACKEND_PORT").unwrap();
        assert_eq!((s.name, s.on, s.scale), ("SGLang", false, Engine::HigherFirst));
        let s =
            seen_in("python -m sglang.launch_server --enable-priority-scheduling --schedule-low-priority-values-first")
                .unwrap();
        assert_eq!((s.on, s.scale), (true, Engine::LowerFirst));
        let s = seen_in("vllm serve m --scheduling-policy priority").unwrap();
        assert_eq!((s.name, s.on, s.scale), ("vLLM", true, Engine::LowerFirst));
        assert!(seen_in("/opt/venv/bin/vllm serve m --scheduling-policy=priority").unwrap().on);
        assert!(!seen_in("python -m vllm.entrypoints.openai.api_server --scheduling-policy fcfs").unwrap().on);
        // Wrapped in a shell, as the replicas' commands often are.
        let s = seen_in("sh -c 'exec python3 -m sglang.launch_server --enable-priority-scheduling'").unwrap();
        assert_eq!((s.name, s.on), ("SGLang", true));
        assert_eq!(seen_in("llama-server -m model.gguf --port 8000"), None);
        assert_eq!(seen_in("my-vllm-wrapper --x"), None, "a word that only contains the name");
    }

    /// From onepoold.toml through the policy's classes: what the engine is
    /// told, what `--check` warns of, and values refused where written.
    #[test]
    fn an_endpoint_s_priority_resolves_from_its_command_and_classes() {
        let policy = std::env::current_dir().unwrap().join("../etc/onepool.toml");
        let config = |command: &str, priority: &str| {
            let mut c = crate::config::parse(
                "t.toml",
                &format!(
                    "control_socket = \"/tmp/x.sock\"\npolicy = \"{}\"\n[[endpoint]]\nname = \"llm\"\nlisten = \"127.0.0.1:0\"\nrequest_class = \"inference\"\n{priority}\n[endpoint.replicas]\ncommand = \"{command}\"\n",
                    policy.display()
                ),
            )
            .unwrap();
            let warned = warnings(&c.endpoints[0]);
            let resolved = crate::policy_check::resolve_from_policy_as(&mut c, 0).map(|()| {
                let classes = c.endpoints[0].proxy.classes.clone().unwrap();
                let values: Vec<(String, String)> = classes
                    .engine_priority()
                    .map(|p| p.values().map(|(r, v)| (format!("{}", r.0), v.to_string())).collect())
                    .unwrap_or_default();
                (values, summary(&c.endpoints[0], &classes))
            });
            (resolved, warned)
        };
        let sglang = "python3 -m sglang.launch_server --enable-priority-scheduling";
        let (resolved, warned) = config(sglang, "");
        let (values, line) = resolved.unwrap();
        // The sample policy: inference-baseline and critical-training 0,
        // training 1, inference 2, agents 3; SGLang serves higher first.
        let want: Vec<(String, String)> = [("0", "3"), ("1", "2"), ("2", "1"), ("3", "0")]
            .iter()
            .map(|(r, v)| (r.to_string(), v.to_string()))
            .collect();
        assert_eq!(values, want);
        assert!(line.contains("SGLang's `priority`") && line.contains("agents 0"), "{line}");
        assert!(warned.is_empty(), "{warned:?}");
        // Auto without the flag: nothing sent, and said.
        let (resolved, warned) = config("python3 -m sglang.launch_server", "");
        assert_eq!(resolved.unwrap().0, []);
        assert!(
            warned[0].contains("runs SGLang without --enable-priority-scheduling, so onepool sends it no priority"),
            "{warned:?}"
        );
        // Named, for vLLM, without its flag: sent (lower first), and said
        // what vLLM does with it.
        let (resolved, warned) =
            config("vllm serve m", "[endpoint.priority]\nengine = \"vllm\"\nvalues = { agents = 9 }");
        let values = resolved.unwrap().0;
        assert_eq!(values.first(), Some(&("0".to_string(), "0".to_string())));
        assert_eq!(values.last(), Some(&("3".to_string(), "9".to_string())), "agents' own value");
        assert!(warned[0].contains("vLLM refuses a request whose priority is not 0 without it"), "{warned:?}");
        // llama-server: none, and nothing to say.
        let (resolved, warned) = config("llama-server -m m.gguf", "");
        assert_eq!((resolved.unwrap().0, warned), (vec![], vec![]));
        let (resolved, _) = config(sglang, "[endpoint.priority]\nvalues = { gold = 1 }");
        let e = resolved.unwrap_err();
        assert!(
            e.contains("endpoint \"llm\" priority.values.gold: \"gold\" is not a request class of the endpoint"),
            "{e}"
        );
        let e = crate::config::parse(
            "t.toml",
            "control_socket = \"/tmp/x.sock\"\n[[endpoint]]\nname = \"llm\"\nlisten = \"127.0.0.1:0\"\n[endpoint.priority]\nengine = \"tgi\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("t.toml:6:10: error: priority.engine = \"tgi\" is not an engine"), "{e}");
    }
}
