//! The alerts shipped in deploy/monitoring/prometheus-rule.yaml, each run
//! by `promtool test rules` against series where it must fire (with what it
//! says) and where it must not: tests/alerts/alerts-test.yaml.

use std::process::Command;

const RULE: &str = "deploy/monitoring/prometheus-rule.yaml";
const TESTS: &str = "tests/alerts/alerts-test.yaml";

fn promtool() -> String {
    std::env::var("PROMTOOL").unwrap_or_else(|_| "promtool".into())
}

#[test]
fn every_alert_fires_when_it_should_and_only_then() {
    let rule: serde_json::Value = serde_saphyr::from_str(&std::fs::read_to_string(RULE).unwrap()).unwrap();
    let tests = std::fs::read_to_string(TESTS).unwrap();
    // The test file names its rules file `rules.json`, beside it: the
    // PrometheusRule's spec, which is a plain rules file (JSON is YAML).
    let dir = format!("{}/alerts", env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(format!("{dir}/rules.json"), serde_json::to_vec_pretty(&rule["spec"]).unwrap()).unwrap();
    std::fs::write(format!("{dir}/alerts-test.yaml"), &tests).unwrap();

    let alerts: Vec<&str> = rule["spec"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .filter_map(|r| r["alert"].as_str())
        .collect();
    assert!(alerts.len() >= 4, "{alerts:?}");
    // Each alert's cases, by whether they expect it to fire.
    let cases: serde_json::Value = serde_saphyr::from_str(&tests).unwrap();
    let expectations: Vec<(&str, bool)> = cases["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().into_iter().flatten())
        .map(|c| (c["alertname"].as_str().unwrap(), c["exp_alerts"].as_array().is_some_and(|a| !a.is_empty())))
        .collect();
    for alert in &alerts {
        let fires = expectations.iter().any(|(name, fires)| name == alert && *fires);
        let quiet = expectations.iter().any(|(name, fires)| name == alert && !*fires);
        assert!(fires && quiet, "{alert} needs a case where it fires and one where it does not in {TESTS}");
    }

    let out = Command::new(promtool())
        .args(["test", "rules", &format!("{dir}/alerts-test.yaml")])
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run promtool ({e}): hack/test.sh installs it (Debian's prometheus package); \
                 or set PROMTOOL to its path"
            )
        });
    assert!(
        out.status.success(),
        "promtool test rules failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
