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
    for alert in &alerts {
        let cases = tests.matches(&format!("alertname: {alert}\n")).count();
        assert!(cases >= 2, "{alert} needs a case where it fires and one where it does not in {TESTS}");
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
