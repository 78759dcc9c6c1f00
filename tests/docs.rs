//! The docs against what ships: docs/configuration.md's flags against the
//! binary's flag definitions and deploy/'s Deployment, docs/metrics.md
//! against the registry, and the user docs against CONTRIBUTING.md's rules
//! (no build hash: a figure's history lives in the benchmark record,
//! docs/api-cost.md; no sentence over 60 words).

use std::collections::{BTreeMap, BTreeSet};

use clap::CommandFactory;
use sample_controller::Cli;
use sample_controller::testing::observe::Metrics;

/// What a user reads: every figure current, stated once.
const USER_DOCS: [&str; 12] = [
    "README.md",
    "SECURITY.md",
    "docs/install.md",
    "docs/image.md",
    "docs/configuration.md",
    "docs/metrics.md",
    "docs/sizing.md",
    "docs/operations.md",
    "docs/upgrading.md",
    "docs/design.md",
    "crates/kube-lease-fence/README.md",
    "crates/kube-secure-metrics/README.md",
];

/// The longest sentence a user doc may have, in words.
const MAX_WORDS: usize = 60;

fn read(path: &str) -> String {
    let full = format!("{}/{path}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

/// The rows of the Markdown tables in `doc` whose first cell starts with
/// `` `prefix ``, each a list of trimmed cells.
fn table_rows(doc: &str, prefix: &str) -> Vec<Vec<String>> {
    doc.lines()
        .filter(|line| line.starts_with(&format!("| `{prefix}")))
        .map(|line| line.trim().trim_matches('|').split(" | ").map(|cell| cell.trim().to_owned()).collect())
        .collect()
}

/// `` `x` `` → `x`.
fn code(cell: &str) -> Option<&str> {
    cell.strip_prefix('`')?.strip_suffix('`')
}

/// The value deploy/'s Deployment gives each flag it sets in its args
/// (`--flag=value`; a flag alone is `true`).
fn deployed_flags() -> BTreeMap<String, String> {
    let deployment = read("deploy/05-deployment.yaml");
    let args = deployment.lines().map(str::trim).filter_map(|line| line.strip_prefix("- --"));
    args.map(|arg| match arg.split_once('=') {
        Some((flag, value)) => (format!("--{flag}"), value.to_owned()),
        None => (format!("--{arg}"), "true".to_owned()),
    })
    .collect()
}

#[test]
fn every_flag_is_in_the_configuration_reference_with_its_variable_default_and_deploy_value() {
    let doc = read("docs/configuration.md");
    let rows: BTreeMap<String, Vec<String>> =
        table_rows(&doc, "--").into_iter().map(|row| (code(&row[0]).unwrap_or(&row[0]).to_owned(), row)).collect();
    let deployed = deployed_flags();
    let cli = Cli::command();
    let flags: Vec<_> =
        cli.get_arguments().filter(|a| a.get_long().is_some_and(|l| l != "help" && l != "version")).collect();
    let mut wrong = Vec::new();
    for flag in &flags {
        let name = format!("--{}", flag.get_long().unwrap());
        let Some(row) = rows.get(&name) else {
            wrong.push(format!("{name}: no row"));
            continue;
        };
        let variable = flag.get_env().map(|v| v.to_string_lossy().into_owned());
        if variable.as_deref() != code(&row[1]) {
            wrong.push(format!("{name}: variable {:?}, the page says {}", variable, row[1]));
        }
        let default: Vec<_> = flag.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect();
        match default.as_slice() {
            [one] if code(&row[2]) != Some(one) => {
                wrong.push(format!("{name}: default `{one}`, the page says {}", row[2]))
            }
            [] if row[2].starts_with('`') => wrong.push(format!("{name}: no default, the page gives {}", row[2])),
            _ => {}
        }
        let in_deploy = deployed.get(&name).map(String::as_str);
        if in_deploy != code(&row[3]) && !(in_deploy.is_none() && row[3] == "—") {
            wrong.push(format!("{name}: deploy/ sets {in_deploy:?}, the page says {}", row[3]));
        }
    }
    let known: BTreeSet<String> = flags.iter().map(|f| format!("--{}", f.get_long().unwrap())).collect();
    wrong.extend(rows.keys().filter(|name| !known.contains(*name)).map(|name| format!("{name}: no such flag")));
    assert!(wrong.is_empty(), "docs/configuration.md against the flags:\n{}", wrong.join("\n"));
}

/// Each family of an OpenMetrics text by its sample name (counters with
/// `_total`), with its type and the labels of its samples.
fn families(text: &str) -> BTreeMap<String, (String, BTreeSet<String>)> {
    let mut families = BTreeMap::new();
    for line in text.lines() {
        if let Some(typed) = line.strip_prefix("# TYPE ") {
            let (name, kind) = typed.split_once(' ').unwrap();
            let sample = if kind == "counter" { format!("{name}_total") } else { name.to_owned() };
            families.insert(sample, (kind.to_owned(), BTreeSet::new()));
        }
    }
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, labels)) = line.split_once('{') else { continue };
        let family = families
            .keys()
            .filter(|name| {
                series == name.as_str() || series.strip_prefix(name.as_str()).is_some_and(|s| s.starts_with('_'))
            })
            .max_by_key(|name| name.len())
            .cloned();
        let Some(family) = family else { continue };
        let labels = labels.split('}').next().unwrap().split(',').filter_map(|kv| kv.split_once('=')).map(|(k, _)| k);
        let set = &mut families.get_mut(&family).unwrap().1;
        set.extend(labels.filter(|k| *k != "le").map(str::to_owned));
    }
    families
}

#[test]
fn every_metric_is_in_the_metrics_reference_with_its_type_and_labels() {
    let registered = families(&Metrics::with_every_family().encode());
    let doc = read("docs/metrics.md");
    let mut documented = BTreeMap::new();
    for row in table_rows(&doc, "") {
        let labels: BTreeSet<String> = row[2].split(", ").filter_map(code).map(str::to_owned).collect();
        documented.insert(code(&row[0]).unwrap().to_owned(), (row[1].clone(), labels));
    }
    let mut wrong = Vec::new();
    for (name, family) in &registered {
        match documented.get(name) {
            None => wrong.push(format!("{name}: not on the page")),
            Some(doc) if doc != family => wrong.push(format!("{name}: registered {family:?}, the page says {doc:?}")),
            Some(_) => {}
        }
    }
    wrong.extend(documented.keys().filter(|n| !registered.contains_key(*n)).map(|n| format!("{n}: not registered")));
    assert!(wrong.is_empty(), "docs/metrics.md against the registry:\n{}", wrong.join("\n"));
}

/// The prose of a Markdown document: fenced code blocks and inline code
/// left out (a hash in a command's output, a long YAML line are not prose).
fn prose(doc: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in doc.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            let without_code: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
            out.push_str(&without_code);
            out.push('\n');
        }
    }
    out
}

/// Words that read as a git build hash: seven to twelve hex digits, with a
/// digit and a letter among them (not a word, not a number).
fn build_hashes(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| (7..=12).contains(&w.len()) && w.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()))
        .filter(|w| w.chars().any(|c| c.is_ascii_digit()) && w.chars().any(|c| c.is_ascii_alphabetic()))
        .map(str::to_owned)
        .collect()
}

#[test]
fn no_user_doc_names_a_build_a_figures_history_lives_in_the_benchmark_record() {
    let named: Vec<String> = USER_DOCS
        .iter()
        .flat_map(|path| build_hashes(&prose(&read(path))).into_iter().map(move |hash| format!("{path}: {hash}")))
        .collect();
    assert!(
        named.is_empty(),
        "build hashes in user docs (state today's figure; its history goes to docs/api-cost.md):\n{}",
        named.join("\n")
    );
}

#[test]
fn a_build_hash_is_told_from_words_and_numbers() {
    assert_eq!(
        build_hashes("build 8da1021, 2026-11-26: 10000 Foos, deadbeef accepted, a1b2c3d4e5"),
        ["8da1021", "a1b2c3d4e5"]
    );
}

/// The sentences of `text`: split at `.`, `!` or `?` before a space or a
/// line's end, at blank lines, list items and table cells.
fn sentences(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for block in text.split("\n\n") {
        for piece in block.split('|').flat_map(|cell| cell.split("\n- ")) {
            let mut current = String::new();
            let words: Vec<&str> = piece.split_whitespace().collect();
            for word in words {
                current.push_str(word);
                current.push(' ');
                if word.ends_with(['.', '!', '?']) && !word.ends_with("e.g.") && !word.ends_with("i.e.") {
                    out.push(std::mem::take(&mut current));
                }
            }
            out.push(current);
        }
    }
    out.retain(|s| !s.trim().is_empty());
    out
}

#[test]
fn no_sentence_of_a_user_doc_runs_past_sixty_words() {
    let long: Vec<String> = USER_DOCS
        .iter()
        .flat_map(|path| {
            sentences(&prose(&read(path)))
                .into_iter()
                .filter(|s| s.split_whitespace().count() > MAX_WORDS)
                .map(move |s| format!("{path} ({} words): {}", s.split_whitespace().count(), s.trim()))
        })
        .collect();
    assert!(long.is_empty(), "sentences over {MAX_WORDS} words:\n{}", long.join("\n\n"));
}
