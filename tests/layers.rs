//! The modules of src/ stand in layers: each uses (`crate::…`) only modules
//! of the layers below its own. So there is no import cycle, and a change
//! that adds one, or an upward import, fails here and names it. The layers
//! are listed once, here; docs/design.md draws them.
//!
//! Doc comments may link anywhere (a link is not a dependency), and a
//! module's `#[cfg(test)] mod tests` may use the test fixtures
//! ([`FIXTURES`]), which stand beside the layers.

use std::collections::BTreeMap;
use std::path::Path;

/// Top down: the process, the controller, a sync, what a sync uses, the
/// pure core, the plumbing.
const LAYERS: &[&[&str]] = &[
    &["app"],
    &["controller", "check", "go_flags"],
    &["sync", "watchdog", "backlog", "cli", "http"],
    &["events", "adoption", "cache", "tls", "metrics_auth"],
    &["leader", "decision"],
    &["client", "watch", "deployment"],
    &["metrics", "retry", "telemetry", "error", "wire"],
    &["foo", "leader_fence", "shard", "workqueue", "process"],
    &["constants"],
];

/// Test fixtures (`cfg(test)` or the test-fixtures feature): used by tests only.
const FIXTURES: &[&str] = &["testing"];

/// The crate root and the binaries use everything and nothing uses them.
const ROOTS: &[&str] = &["lib", "main"];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

/// The modules `code` uses through `crate::` paths, outside comments and its
/// test module: `crate::a::b`, `crate::{a, b::c}`.
fn uses(code: &str) -> Vec<String> {
    let mut used = Vec::new();
    for line in code.lines() {
        let line = line.trim_start();
        if line.starts_with("#[cfg(test)]") {
            break; // the tests module closes every file
        }
        if line.starts_with("//") {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let end = group.find('}').unwrap_or(group.len());
                used.extend(group[..end].split(',').filter_map(|item| first_segment(item.trim())));
            } else {
                used.extend(first_segment(rest));
            }
        }
    }
    used.sort();
    used.dedup();
    used
}

fn first_segment(path: &str) -> Option<String> {
    let name: String = path.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
    // `crate::Foo` (a re-export at the root) is not a module.
    (!name.is_empty() && name.starts_with(|c: char| c.is_ascii_lowercase())).then_some(name)
}

/// Every module of `src`, with the text of its files (a directory module's
/// files belong to it).
fn modules(src: &Path) -> BTreeMap<String, String> {
    let mut modules = BTreeMap::new();
    for entry in std::fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()).map(str::to_owned) else { continue };
        if path.is_dir() {
            if stem == "bin" {
                continue;
            }
            for file in std::fs::read_dir(&path).unwrap() {
                let text = std::fs::read_to_string(file.unwrap().path()).unwrap();
                modules.entry(stem.clone()).or_insert_with(String::new).push_str(&text);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            modules.entry(stem).or_insert_with(String::new).push_str(&std::fs::read_to_string(&path).unwrap());
        }
    }
    modules
}

/// What breaks the layering: unplaced modules, and imports that do not go
/// down.
fn violations(modules: &BTreeMap<String, String>) -> Vec<String> {
    let mut found = Vec::new();
    for (module, code) in modules {
        if ROOTS.contains(&module.as_str()) || FIXTURES.contains(&module.as_str()) {
            continue;
        }
        let Some(from) = layer_of(module) else {
            found.push(format!("{module} is in no layer: place it in tests/layers.rs and docs/design.md"));
            continue;
        };
        for used in uses(code) {
            match layer_of(&used) {
                Some(to) if to > from => {}
                Some(to) => found.push(format!(
                    "{module} (layer {}) uses {used} (layer {}): {}",
                    from + 1,
                    to + 1,
                    if to == from { "same layer" } else { "upward" }
                )),
                None if FIXTURES.contains(&used.as_str()) => {
                    found.push(format!("{module} uses the test fixtures outside its tests"))
                }
                None => found.push(format!("{module} uses {used}, which is in no layer")),
            }
        }
    }
    found
}

#[test]
fn every_module_uses_only_the_layers_below_its_own() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = modules(&src);
    let found = violations(&modules);
    assert!(found.is_empty(), "the layers of src/ are broken:\n  {}", found.join("\n  "));
    for layer in LAYERS {
        for module in *layer {
            assert!(modules.contains_key(*module), "tests/layers.rs lists {module}, which src/ does not have");
        }
    }
}

#[test]
fn an_upward_import_a_cycle_and_an_unplaced_module_are_each_reported() {
    let modules: BTreeMap<String, String> = [
        ("retry", "use crate::sync::Context;\n"),
        ("foo", "use crate::{constants::X, workqueue};\n"),
        ("constants", "// a doc link to [`crate::app`] is no import\n"),
        ("newcomer", "use crate::foo::Foo;\n"),
        ("error", "#[cfg(test)]\nmod tests { use crate::testing::x; }\n"),
        ("telemetry", "fn f() { crate::testing::x(); }\n"),
    ]
    .into_iter()
    .map(|(m, code)| (m.to_owned(), code.to_owned()))
    .collect();
    assert_eq!(
        violations(&modules),
        [
            "foo (layer 8) uses workqueue (layer 8): same layer",
            "newcomer is in no layer: place it in tests/layers.rs and docs/design.md",
            "retry (layer 7) uses sync (layer 3): upward",
            "telemetry uses the test fixtures outside its tests",
        ]
    );
}
