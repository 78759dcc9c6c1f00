//! src/ is a folder per concept, and the folders stand in layers: every file
//! of a folder uses (`crate::…`) only the folders of the layers below its
//! own (its own folder's files it uses freely). So there is no import cycle
//! between concepts, and a change that adds one, or an upward import, fails
//! here and names the file. The layers are listed once, here; docs/design.md
//! draws them.
//!
//! Below [`FOO`] stands the machinery any controller could use — the
//! client with its retries and paced watches, metrics and logs: being below
//! it, none of it can import the Foo. (Leader election and its fence, and
//! the metrics server with its authentication, are crates of their own,
//! crates/kube-lease-fence and crates/kube-secure-metrics, which cannot
//! import this one.)
//!
//! Every file is read whole: doc comments may link anywhere (a link is not
//! a dependency), and code under `#[cfg(test)]` may use the test fixtures
//! ([`FIXTURES`]), which stand beside the layers.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Top down: the process, the operator's tools, the controller's wiring, a
/// sync, the caches, the Foo API; then the machinery.
const LAYERS: &[&[&str]] =
    &[&["app"], &["ops"], &["controller"], &["reconcile"], &["cache"], &["api"], &["client"], &["observe"]];

/// The folder of the Foo's own types: the layers below it never see a Foo.
const FOO: &str = "api";

/// Test fixtures (`cfg(test)` or the test-fixtures feature): used by tests only.
const FIXTURES: &[&str] = &["testing"];

/// The crate root and the binaries use everything and nothing uses them.
const ROOTS: &[&str] = &["lib", "main", "bin"];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

/// The top-level modules `code` uses through `crate::` paths, outside
/// comments and outside items under `#[cfg(test)]`: `crate::a::b`,
/// `crate::{a, b::c}`.
fn uses(code: &str) -> Vec<String> {
    let mut used = Vec::new();
    for line in non_test_lines(code) {
        let line = line.trim_start();
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

/// `code` without the items marked `#[cfg(test)]`: a one-line item, or a
/// block up to its closing brace, wherever in the file it stands.
fn non_test_lines(code: &str) -> Vec<&str> {
    let (mut kept, mut lines) = (Vec::new(), code.lines());
    while let Some(line) = lines.next() {
        if line.trim_start() != "#[cfg(test)]" {
            kept.push(line);
            continue;
        }
        let mut depth = 0i32;
        for item in lines.by_ref() {
            depth += item.matches('{').count() as i32 - item.matches('}').count() as i32;
            let attribute = item.trim_start().starts_with("#[");
            if depth <= 0 && !attribute && (item.trim_end().ends_with(['}', ';'])) {
                break;
            }
        }
    }
    kept
}

fn first_segment(path: &str) -> Option<String> {
    let name: String = path.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
    // `crate::Foo` (a re-export at the root) is not a module.
    (!name.is_empty() && name.starts_with(|c: char| c.is_ascii_lowercase())).then_some(name)
}

/// Every .rs file under `dir`, at any depth.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// Every file of `src`, by its path under src/, with its text.
fn files(src: &Path) -> BTreeMap<String, String> {
    rust_files(src)
        .into_iter()
        .map(|path| {
            let name = path.strip_prefix(src).unwrap().to_string_lossy().replace('\\', "/");
            (name, std::fs::read_to_string(&path).unwrap())
        })
        .collect()
}

/// The top-level module a file of src/ belongs to: its folder, or its
/// own name for a file at the top.
fn module_of(file: &str) -> &str {
    let first = file.split('/').next().unwrap_or(file);
    first.strip_suffix(".rs").unwrap_or(first)
}

/// What breaks the layering: files of unplaced modules, and imports that do
/// not go down.
fn violations(files: &BTreeMap<String, String>) -> Vec<String> {
    let mut found = Vec::new();
    for (file, code) in files {
        let module = module_of(file);
        if ROOTS.contains(&module) || FIXTURES.contains(&module) {
            continue;
        }
        let Some(from) = layer_of(module) else {
            found.push(format!("{file}: {module} is in no layer: place it in tests/layers.rs and docs/design.md"));
            continue;
        };
        for used in uses(code) {
            match layer_of(&used) {
                Some(to) if used == module || to > from => {}
                Some(to) => found.push(format!(
                    "{file} ({module}, layer {}) uses {used} (layer {}): {}",
                    from + 1,
                    to + 1,
                    if to == from { "same layer" } else { "upward" }
                )),
                None if FIXTURES.contains(&used.as_str()) => {
                    found.push(format!("{file} uses the test fixtures outside its tests"))
                }
                None => found.push(format!("{file} uses {used}, which is in no layer")),
            }
        }
    }
    found
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn every_file_uses_only_its_own_folder_and_the_layers_below() {
    let files = files(&src());
    let found = violations(&files);
    assert!(found.is_empty(), "the layers of src/ are broken:\n  {}", found.join("\n  "));
    for layer in LAYERS {
        for module in *layer {
            assert!(
                files.keys().any(|file| module_of(file) == *module),
                "tests/layers.rs lists {module}, which src/ does not have"
            );
        }
    }
    assert!(layer_of(FOO).is_some(), "the Foo's folder is in a layer");
}

#[test]
fn every_file_of_src_is_in_the_module_table_of_development_md() {
    let table = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/DEVELOPMENT.md")).unwrap();
    let listed: Vec<&str> = table.lines().filter(|line| line.starts_with("| `src/")).collect();
    let missing: Vec<String> = files(&src())
        .into_keys()
        .filter(|file| !listed.iter().any(|row| row.contains(&format!("`src/{file}`"))))
        .collect();
    assert!(missing.is_empty(), "docs/DEVELOPMENT.md's layout table misses: {}", missing.join(", "));
}

#[test]
fn an_upward_import_a_same_layer_import_and_an_unplaced_folder_are_each_reported() {
    let files: BTreeMap<String, String> = [
        ("client/retry.rs", "use crate::reconcile::sync::Context;\n"),
        ("client/mod.rs", "use crate::{observe::X, client::retry, newcomer};\n"),
        ("api/constants.rs", "// a doc link to [`crate::app`] is no import\n"),
        ("api/foo.rs", "use crate::api::constants::X;\n"),
        ("newcomer/mod.rs", "use crate::api::foo::Foo;\n"),
        ("reconcile/error.rs", "#[cfg(test)]\nmod tests {\n    use crate::testing::x;\n}\n"),
        // An import after a test item is read: every file is read whole.
        (
            "observe/metrics.rs",
            "#[cfg(test)]\nfn only_in_tests() {\n    crate::testing::x();\n}\n\nuse crate::api::foo::Foo;\n",
        ),
        ("observe/telemetry.rs", "fn f() { crate::testing::x(); }\n"),
    ]
    .into_iter()
    .map(|(f, code)| (f.to_owned(), code.to_owned()))
    .collect();
    assert_eq!(
        violations(&files),
        [
            "client/mod.rs uses newcomer, which is in no layer",
            "client/retry.rs (client, layer 7) uses reconcile (layer 4): upward",
            "newcomer/mod.rs: newcomer is in no layer: place it in tests/layers.rs and docs/design.md",
            "observe/metrics.rs (observe, layer 8) uses api (layer 6): upward",
            "observe/telemetry.rs uses the test fixtures outside its tests",
        ]
    );
}

/// Lines of `code` before its tests (`#[cfg(test)] mod tests`, which closes
/// a file).
fn lines_before_tests(code: &str) -> usize {
    code.lines().take_while(|line| line.trim() != "#[cfg(test)]").count()
}

#[test]
fn the_reading_path_of_design_md_is_five_files_of_about_a_thousand_lines_as_it_says() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let design = std::fs::read_to_string(root.join("docs/design.md")).unwrap();
    let section = &design[design.find("## Reading the code").unwrap()..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |end| end + 3)];
    // The numbered list: "1. `src/...`: ...".
    let files: Vec<&str> = section
        .lines()
        .filter_map(|line| line.split_once(". `").filter(|(n, _)| n.parse::<u32>().is_ok()))
        .filter_map(|(_, rest)| rest.split_once('`').map(|(path, _)| path))
        .collect();
    assert!((1..=5).contains(&files.len()), "at most five files to read: {files:?}");
    let counted: usize =
        files.iter().map(|f| lines_before_tests(&std::fs::read_to_string(root.join(f)).unwrap())).sum();
    let stated: usize = section
        .split("five files and\n")
        .nth(1)
        .and_then(|rest| rest.split(" lines").next())
        .map(|n| n.replace(' ', "").parse().unwrap())
        .expect("design.md states the path's lines: \"in five files and N lines\"");
    assert!(counted <= 1_150, "the reading path grew to {counted} lines ({files:?}): about a thousand is its aim");
    assert!(counted.abs_diff(stated) <= 50, "design.md says {stated} lines; the files hold {counted}: {files:?}");
}
