//! The ValidatingAdmissionPolicy that confines the operator's
//! ServiceAccount to the Deployment writes the operator makes
//! (deploy/13-deployment-writes-policy.yaml, which `crdgen
//! deployment-writes-policy` prints and hack/verify-crds.sh checks).
//!
//! RBAC can only grant create, patch and delete on every Deployment of the
//! cluster. This policy has the API server admit that ServiceAccount's
//! Deployment writes only with the fields and values the operator writes:
//! what [`desired_deployment`](crate::api::deployment::desired_deployment)
//! builds (its names, labels, image and the Foo's replicas bounds are read
//! from the same constants here), with what the API server defaults in it,
//! and the sync's patches of replicas and labels. One source: a unit test
//! fails when `desired_deployment` sets a field this policy does not let
//! through, and the confinement tests on a plane create what it builds.
//!
//! It judges every ServiceAccount whose name contains `sample-controller`,
//! in any namespace: deploy/'s, and the same under any kustomize overlay
//! (`namespace:`, `namePrefix:`, `nameSuffix:`), without a parameter — a
//! policy with one is looked up before it knows who writes, so its errors
//! would refuse every user's Deployment writes (it fails closed).

use serde_json::{Value, json};

use crate::api::constants::{
    CONTAINER_IMAGE, CONTAINER_NAME, LABEL_APP, LABEL_APP_VALUE, LABEL_CONTROLLER, LABEL_MANAGED_BY,
    LABEL_MANAGED_BY_VALUE,
};
use crate::api::foo::{REPLICAS_MAX, REPLICAS_MIN};

/// The policy's name, which the API server puts in each of its refusals
/// ("ValidatingAdmissionPolicy '<name>' with binding ..."), under any
/// overlay's prefix or suffix: how a refusal by it is told from another.
pub const CONFINEMENT_POLICY: &str = "sample-controller-deployment-writes";

/// The file it is written to, which every refusal names.
const FILE: &str = "deploy/13-deployment-writes-policy.yaml";

/// The core of the ServiceAccount's name (deploy/01-serviceaccount.yaml),
/// which any overlay's prefix or suffix keeps.
pub(crate) const SERVICE_ACCOUNT: &str = "sample-controller";

/// The CEL variable a shards layout sets to the label keys its Foos'
/// Deployments follow (`--shard-selector`): the first of the policy's
/// variables, so that a kustomize patch can name it by index.
pub(crate) const FOLLOWED_LABEL_KEYS: &str = "followedLabelKeys";

/// The metadata a create may carry: what `desired_deployment` sets, and
/// what the API server sets before admission.
pub(crate) const CREATE_METADATA: &[&str] =
    &["name", "namespace", "labels", "ownerReferences", "uid", "creationTimestamp", "generation", "managedFields"];

/// The Deployment spec's fields `desired_deployment` sets; the others must
/// be absent, or hold the API server's default ([`SPEC_DEFAULTS`]).
pub(crate) const SPEC_SET: &[&str] = &["replicas", "selector", "template"];

/// The pod template's metadata (`creationTimestamp` is the API server's
/// empty value).
pub(crate) const TEMPLATE_METADATA: &[&str] = &["labels", "creationTimestamp"];

/// The pod spec's fields `desired_deployment` sets.
pub(crate) const POD_SET: &[&str] = &["containers"];

/// The container's fields `desired_deployment` sets.
pub(crate) const CONTAINER_SET: &[&str] = &["name", "image"];

/// What the API server defaults in a Deployment that sets none of these,
/// as CEL literals: a create of the operator's ServiceAccount may leave
/// them out or hold exactly these values. Empty maps (`{}`) must be empty.
const SPEC_DEFAULTS: &[(&str, &str)] = &[("revisionHistoryLimit", "10"), ("progressDeadlineSeconds", "600")];
const POD_DEFAULTS: &[(&str, &str)] = &[
    ("restartPolicy", "\"Always\""),
    ("terminationGracePeriodSeconds", "30"),
    ("dnsPolicy", "\"ClusterFirst\""),
    ("schedulerName", "\"default-scheduler\""),
    ("securityContext", "{}"),
];
const CONTAINER_DEFAULTS: &[(&str, &str)] = &[
    // The default for an image tagged `latest`.
    ("imagePullPolicy", "\"Always\""),
    ("resources", "{}"),
    ("terminationMessagePath", "\"/dev/termination-log\""),
    ("terminationMessagePolicy", "\"File\""),
];

/// The metadata a create may carry, as the header of the file explains it.
const HEADER: &str = "\
# The operator's ServiceAccount confined by the API server to the Deployment
# writes the operator makes, field by field and value by value. Generated
# from src/api/confinement.rs by hack/update-crds.sh (hack/verify-crds.sh
# checks it): edit that, not this file.
#
# RBAC (02-clusterrole.yaml) can only grant create, patch and delete on every
# Deployment of the cluster, as upstream's does, so without this policy
# anyone who can run a pod as the ServiceAccount could rewrite any
# Deployment. With it, the API server admits that ServiceAccount's
# Deployment writes only as the operator makes them:
#
# - a CREATE of the Deployment src/api/deployment.rs builds: one controller
#   ownerReference to a Foo, the labels app=nginx, controller=<that Foo>
#   and app.kubernetes.io/managed-by=sample-controller (and a shard's
#   followed labels), 1 to 10 replicas (a Foo's bounds), one container,
#   nginx, of image nginx:latest, and nothing else: no annotations,
#   finalizers, resources, command, securityContext, volumes, host
#   namespaces, ServiceAccount or node placement; the fields the API server
#   defaults must hold its defaults;
# - an UPDATE (a patch arrives as one) of a Deployment a Foo controls that
#   changes nothing but spec.replicas (to 1 to 10) and the labels the
#   operator owns (app.kubernetes.io/managed-by=sample-controller, a shard's
#   followed labels);
# - a DELETE of a Deployment a Foo controls.
#
# The ServiceAccount is told by its name: any whose name contains
# sample-controller, in any namespace, so that a kustomize overlay of
# deploy/ (namespace:, namePrefix:, nameSuffix:) stays confined. No
# parameter: a policy with one is looked up for every user's write before
# it knows who writes, and this one fails closed (failurePolicy: Fail). The
# leader checks at start and every --confinement-check-period that the API
# server refuses a write this policy must refuse and admits one it must
# admit (the gauge sample_controller_confinement, alert
# SampleControllerConfinementOff; docs/install.md).
#
# Shards: the first variable, followedLabelKeys, lists the label keys of
# --shard-selector (artifacts/shards sets [\"shard\"]).
#
# Its binding is 14-deployment-writes-binding.yaml: delete that to turn it
# off (the ServiceAccount may then write any Deployment its RBAC allows).
";

/// deploy/13-deployment-writes-policy.yaml as it is generated: the header,
/// then the policy as YAML.
pub fn policy_file(labels: Value) -> Result<String, String> {
    let yaml = serde_saphyr::to_string(&policy(labels)).map_err(|e| format!("cannot serialize the policy: {e}"))?;
    Ok(format!("{HEADER}{yaml}"))
}

/// The ValidatingAdmissionPolicy, with `labels` on its metadata.
pub(crate) fn policy(labels: Value) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": { "name": CONFINEMENT_POLICY, "labels": labels },
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": { "resourceRules": [{
                "apiGroups": ["apps"],
                "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE", "DELETE"],
                "resources": ["deployments"],
            }]},
            "matchConditions": [{ "name": "the-operator", "expression": the_operator() }],
            "variables": variables(),
            "validations": validations(),
        }
    })
}

/// Whether the request's user is the operator's ServiceAccount under any
/// overlay of deploy/.
fn the_operator() -> String {
    format!(r#"request.userInfo.username.matches("^system:serviceaccount:[^:]+:[^:]*{SERVICE_ACCOUNT}[^:]*$")"#)
}

/// A CEL list of string literals.
fn cel_list(items: &[&str]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| format!("{i:?}")).collect();
    format!("[{}]", quoted.join(", "))
}

/// A CEL map literal of the defaults, each value `dyn`: the API server
/// wants a literal's values of one type.
fn cel_map(pairs: &[(&str, &str)]) -> String {
    let entries: Vec<String> = pairs.iter().map(|(k, v)| format!("{k:?}: dyn({v})")).collect();
    format!("{{{}}}", entries.join(", "))
}

fn variable(name: &str, expression: String) -> Value {
    json!({ "name": name, "expression": expression })
}

/// CEL: the fields of the object `at` (its path `path`) that are not as
/// the operator builds it — a field it does not set (not in `set`), or one
/// the API server defaults (`defaults`, a variable's map) with another
/// value — each as `[path, value]`.
fn fields_not_as_built(at: &str, path: &str, set: &[&str], defaults: &str) -> String {
    format!(
        "dyn({at}).map(k, k).filter(k, k in {defaults}\n\
         ? (type({defaults}[k]) == map ? size(dyn({at})[k]) != 0 : dyn({at})[k] != {defaults}[k]) : !(k in {set}))\n\
         .map(k, [dyn(\"{path}.\" + k), dyn({at})[k]])",
        set = cel_list(set),
    )
}

/// CEL: the labels of `at` (a map, maybe absent) that differ from
/// `expected` (a variable's map), missing ones too, each as
/// `[path.key, value]`.
fn labels_not_as_built(at: &str, path: &str, expected: &str) -> String {
    format!(
        "{expected}.map(k, k).filter(k, !(k in {at}.orValue({{}}))).map(k, [dyn(\"{path}.\" + k), dyn(\"(missing)\")])\n\
         + {at}.orValue({{}}).map(k, k).filter(k, !(k in {expected}) || {at}.orValue({{}})[k] != {expected}[k])\n\
         .map(k, [dyn(\"{path}.\" + k), dyn({at}.orValue({{}})[k])])"
    )
}

/// The policy's variables, [`FOLLOWED_LABEL_KEYS`] first.
fn variables() -> Vec<Value> {
    let mut all = owner_variables();
    all.push(variable("notAsBuilt", format!("request.operation != \"CREATE\" ? [] :\n{}", not_as_built())));
    all.extend(update_variables());
    all
}

/// Who owns the Deployment, and the labels and defaults it must carry.
fn owner_variables() -> Vec<Value> {
    vec![
        variable(FOLLOWED_LABEL_KEYS, "[]".into()),
        // The Deployment as it was (UPDATE, DELETE) or will be (CREATE).
        variable("subject", r#"request.operation == "CREATE" ? object : oldObject"#.into()),
        variable(
            "owners",
            "has(variables.subject.metadata.ownerReferences) ? variables.subject.metadata.ownerReferences : []".into(),
        ),
        // A controller ownerReference to a Foo, read as the operator reads
        // one (src/api/deployment.rs, controlling_foo).
        variable(
            "fooControlled",
            r#"variables.owners.exists(r, r.apiVersion == "samplecontroller.k8s.io/v1alpha1" && r.kind == "Foo"
  && has(r.controller) && r.controller)"#
                .into(),
        ),
        variable("fooName", r#"size(variables.owners) == 1 ? variables.owners[0].name : """#.into()),
        // The labels of the selector and the pods, and the Deployment's own.
        variable(
            "podLabels",
            format!(r#"{{"{LABEL_APP}": "{LABEL_APP_VALUE}", "{LABEL_CONTROLLER}": string(variables.fooName)}}"#),
        ),
        variable(
            "deploymentLabels",
            format!(
                r#"{{"{LABEL_APP}": "{LABEL_APP_VALUE}", "{LABEL_CONTROLLER}": string(variables.fooName), "{LABEL_MANAGED_BY}": "{LABEL_MANAGED_BY_VALUE}"}}"#
            ),
        ),
        variable("specDefaults", cel_map(SPEC_DEFAULTS)),
        variable("podDefaults", cel_map(POD_DEFAULTS)),
        variable("containerDefaults", cel_map(CONTAINER_DEFAULTS)),
    ]
}

/// CEL, for a CREATE: every field not as the operator builds it, as
/// `[path, value]`, from the metadata down to the container.
fn not_as_built() -> String {
    let pod = "object.spec.template.spec";
    let parts = [
        format!(
            "dyn(object.metadata).map(k, k).filter(k, !(k in {})).map(k, [dyn(\"metadata.\" + k), dyn(object.metadata)[k]])",
            cel_list(CREATE_METADATA)
        ),
        format!(
            "object.metadata.?labels.orValue({{}}).map(k, k).filter(k, !(k in variables.deploymentLabels || k in variables.{FOLLOWED_LABEL_KEYS})\n\
             || (k in variables.deploymentLabels && object.metadata.labels[k] != variables.deploymentLabels[k]))\n\
             .map(k, [dyn(\"metadata.labels.\" + k), dyn(object.metadata.labels[k])])"
        ),
        fields_not_as_built("object.spec", "spec", &[SPEC_SET, &["strategy"]].concat(), "variables.specDefaults"),
        "(object.spec.?strategy.?type.orValue(\"RollingUpdate\") == \"RollingUpdate\"\n\
         && string(object.spec.?strategy.?rollingUpdate.?maxSurge.orValue(\"25%\")) == \"25%\"\n\
         && string(object.spec.?strategy.?rollingUpdate.?maxUnavailable.orValue(\"25%\")) == \"25%\"\n\
         ? [] : [[dyn(\"spec.strategy\"), dyn(object.spec.strategy)]])"
            .to_owned(),
        "dyn(object.spec.selector).map(k, k).filter(k, k != \"matchLabels\").map(k, [dyn(\"spec.selector.\" + k), dyn(object.spec.selector)[k]])"
            .to_owned(),
        labels_not_as_built("object.spec.selector.?matchLabels", "spec.selector.matchLabels", "variables.podLabels"),
        format!(
            "dyn(object.spec.template.metadata).map(k, k).filter(k, !(k in {})).map(k, [dyn(\"spec.template.metadata.\" + k), dyn(object.spec.template.metadata)[k]])",
            cel_list(TEMPLATE_METADATA)
        ),
        labels_not_as_built("object.spec.template.metadata.?labels", "spec.template.metadata.labels", "variables.podLabels"),
        fields_not_as_built(pod, "spec.template.spec", POD_SET, "variables.podDefaults"),
        format!(
            "{pod}.containers.map(c, {}).flatten()",
            fields_not_as_built("c", "spec.template.spec.containers[\" + c.name + \"]", CONTAINER_SET, "variables.containerDefaults")
        ),
    ];
    parts.join("\n+ ")
}

/// UPDATE: what changed besides the labels and the replicas, and the
/// labels changed that the operator does not own.
fn update_variables() -> Vec<Value> {
    let update = |expression: &str| format!("request.operation != \"UPDATE\" ? [] :\n{expression}");
    vec![
        // The fields of metadata and spec that changed, besides the labels
        // and replicas, and what the API server itself changes on every
        // write.
        variable(
            "changed",
            update(
                r#"dyn(oldObject.metadata).map(k, k).filter(k, !(k in ["labels", "resourceVersion", "generation", "managedFields"])
  && (!(k in dyn(object.metadata)) || dyn(oldObject.metadata)[k] != dyn(object.metadata)[k])).map(k, "metadata." + k)
+ dyn(object.metadata).map(k, k).filter(k, !(k in ["labels", "resourceVersion", "generation", "managedFields"])
  && !(k in dyn(oldObject.metadata))).map(k, "metadata." + k)
+ dyn(oldObject.spec).map(k, k).filter(k, k != "replicas"
  && (!(k in dyn(object.spec)) || dyn(oldObject.spec)[k] != dyn(object.spec)[k])).map(k, "spec." + k)
+ dyn(object.spec).map(k, k).filter(k, k != "replicas" && !(k in dyn(oldObject.spec))).map(k, "spec." + k)"#,
            ),
        ),
        // The labels set, changed or removed, as [key, new value].
        variable(
            "relabelled",
            update(
                r#"object.metadata.?labels.orValue({}).map(k, k).filter(k, !(k in oldObject.metadata.?labels.orValue({}))
  || oldObject.metadata.labels[k] != object.metadata.labels[k]).map(k, [dyn(k), dyn(object.metadata.labels[k])])
+ oldObject.metadata.?labels.orValue({}).map(k, k).filter(k, !(k in object.metadata.?labels.orValue({}))).map(k, [dyn(k), dyn("(removed)")])"#,
            ),
        ),
        // Of those, the ones the operator does not own, or its managed-by
        // label changed to another value or removed.
        variable(
            "foreignLabels",
            format!(
                r#"variables.relabelled.filter(l, !(l[0] == "{LABEL_MANAGED_BY}" || l[0] in variables.{FOLLOWED_LABEL_KEYS})
  || (l[0] == "{LABEL_MANAGED_BY}" && l[1] != "{LABEL_MANAGED_BY_VALUE}"))"#
            ),
        ),
    ]
}

/// CEL: `v` (a field's value) as a message shows it: a scalar as written, a
/// list's strings, a map's keys.
fn shown(v: &str) -> String {
    format!(
        "(type({v}) == string ? {v} : type({v}) == int || type({v}) == bool || type({v}) == double ? string({v})\n\
         : type({v}) == list ? \"[\" + {v}.map(x, type(x) == string ? x : \"{{…}}\").join(\", \") + \"]\"\n\
         : \"{{\" + dyn({v}).map(x, string(x)).join(\", \") + \"}}\")"
    )
}

fn validation(expression: String, message: String, message_expression: Option<String>) -> Value {
    let mut v = json!({ "expression": expression, "message": message, "reason": "Forbidden" });
    if let Some(m) = message_expression {
        v["messageExpression"] = m.into();
    }
    v
}

/// Who the validations' messages name.
const WHO: &str = "the sample-controller ServiceAccount";

fn validations() -> Vec<Value> {
    let mut all = vec![validation(
        "variables.fooControlled".into(),
        format!("{WHO} may only write the Deployments of Foos ({FILE})"),
        Some(format!(
            r#""{WHO} may only " + request.operation.lowerAscii()
+ (request.operation == "CREATE" ? " a Deployment with" : " a Deployment that has")
+ " a controller ownerReference to a Foo (samplecontroller.k8s.io/v1alpha1): it writes only the Deployments of Foos ({FILE})""#
        )),
    )];
    all.extend(create_validations());
    all.extend(update_validations());
    all
}

/// A CREATE: one owner, the operator's container and image, a Foo's
/// replicas, nothing else not as the operator builds it.
fn create_validations() -> Vec<Value> {
    vec![
        validation(
            r#"request.operation != "CREATE" || size(variables.owners) == 1"#.into(),
            format!("{WHO} may only create a Deployment whose one ownerReference is its Foo ({FILE})"),
            None,
        ),
        validation(
            format!(
                r#"request.operation != "CREATE" || (size(object.spec.template.spec.containers) == 1
  && object.spec.template.spec.containers[0].name == "{CONTAINER_NAME}"
  && object.spec.template.spec.containers[0].?image.orValue("") == "{CONTAINER_IMAGE}")"#
            ),
            format!(
                "{WHO} may only create a Deployment of one container, {CONTAINER_NAME}, of image {CONTAINER_IMAGE} ({FILE})"
            ),
            Some(format!(
                r#""{WHO} may only create a Deployment of one container, {CONTAINER_NAME}, of image {CONTAINER_IMAGE}, as the operator builds it; this one has "
+ object.spec.template.spec.containers.map(c, c.name + " (" + c.?image.orValue("no image") + ")").join(", ") + " ({FILE})""#
            )),
        ),
        validation(
            format!(
                r#"request.operation != "CREATE" || ({REPLICAS_MIN} <= object.spec.replicas && object.spec.replicas <= {REPLICAS_MAX})"#
            ),
            format!(
                "{WHO} may only create a Deployment of {REPLICAS_MIN} to {REPLICAS_MAX} replicas, a Foo's bounds ({FILE})"
            ),
            Some(format!(
                r#""{WHO} may only create a Deployment of {REPLICAS_MIN} to {REPLICAS_MAX} replicas, a Foo's bounds; this one sets spec.replicas="
+ string(object.spec.replicas) + " ({FILE})""#
            )),
        ),
        validation(
            "size(variables.notAsBuilt) == 0".into(),
            format!("{WHO} may only create a Deployment as the operator builds it ({FILE})"),
            Some(format!(
                r#""{WHO} may only create a Deployment as the operator builds it; this one sets "
+ variables.notAsBuilt.map(f, f[0] + "=" + {shown}).join(", ")
+ " ({FILE}; if a mutating admission webhook or policy sets them, see docs/install.md, \"The ServiceAccount's confinement\")""#,
                shown = shown("f[1]"),
            )),
        ),
    ]
}

/// An UPDATE: the replicas within a Foo's bounds, the labels the operator
/// owns, nothing else.
fn update_validations() -> Vec<Value> {
    vec![
        validation(
            "size(variables.changed) == 0".into(),
            format!("{WHO} may only change a Deployment's metadata.labels and spec.replicas ({FILE})"),
            Some(format!(
                r#""{WHO} may only change a Deployment's metadata.labels and spec.replicas, not " + variables.changed.join(", ")
+ " ({FILE}): to change a Foo's Deployment otherwise, delete it and the operator creates it again""#
            )),
        ),
        validation(
            format!(
                r#"request.operation != "UPDATE" || object.spec.replicas == oldObject.spec.replicas
  || ({REPLICAS_MIN} <= object.spec.replicas && object.spec.replicas <= {REPLICAS_MAX})"#
            ),
            format!(
                "{WHO} may only scale a Deployment to {REPLICAS_MIN} to {REPLICAS_MAX} replicas, a Foo's bounds ({FILE})"
            ),
            Some(format!(
                r#""{WHO} may only scale a Deployment to {REPLICAS_MIN} to {REPLICAS_MAX} replicas, a Foo's bounds; this sets spec.replicas="
+ string(object.spec.replicas) + " ({FILE})""#
            )),
        ),
        validation(
            "size(variables.foreignLabels) == 0".into(),
            format!("{WHO} may only set the labels the operator owns on a Deployment ({FILE})"),
            Some(format!(
                r#""{WHO} may only set {LABEL_MANAGED_BY}={LABEL_MANAGED_BY_VALUE} and its shard's labels on a Deployment; this sets "
+ variables.foreignLabels.map(l, "metadata.labels." + l[0] + "=" + l[1]).join(", ") + " ({FILE})""#
            )),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Foo;
    use crate::api::deployment::desired_deployment;
    use crate::api::shard::UNSHARDED;
    use crate::testing::FooFixture;

    fn keys(v: &Value) -> Vec<&str> {
        v.as_object().map(|o| o.keys().map(String::as_str).collect()).unwrap_or_default()
    }

    /// The drift test: what `desired_deployment` sets, the policy lets
    /// through (the values are the constants both read).
    #[test]
    fn every_field_desired_deployment_sets_is_one_the_policy_lets_through() {
        let built = serde_json::to_value(desired_deployment(&Foo::test("f").replicas(3), UNSHARDED).unwrap()).unwrap();
        let outside = |v: &Value, allowed: &[&str], at: &str| {
            for k in keys(v) {
                assert!(allowed.contains(&k), "desired_deployment sets {at}.{k}, which the policy refuses");
            }
        };
        outside(&built["metadata"], CREATE_METADATA, "metadata");
        outside(&built["spec"], SPEC_SET, "spec");
        outside(&built["spec"]["template"]["metadata"], TEMPLATE_METADATA, "spec.template.metadata");
        outside(&built["spec"]["template"]["spec"], POD_SET, "spec.template.spec");
        for c in built["spec"]["template"]["spec"]["containers"].as_array().unwrap() {
            outside(c, CONTAINER_SET, "container");
        }
        let labels: Vec<&str> = keys(&built["metadata"]["labels"]);
        assert_eq!(labels, [LABEL_APP, LABEL_MANAGED_BY, LABEL_CONTROLLER], "the labels the policy expects, no more");
    }

    #[test]
    fn the_first_variable_is_the_one_a_shards_layout_patches() {
        let policy = policy(json!({}));
        assert_eq!(policy["spec"]["variables"][0]["name"], FOLLOWED_LABEL_KEYS);
        assert_eq!(policy["spec"]["variables"][0]["expression"], "[]", "deploy/ follows no labels");
    }

    #[test]
    fn the_replica_bounds_are_the_foos() {
        let policy = serde_json::to_string(&policy(json!({}))).unwrap();
        let crd = serde_json::to_value(<Foo as kube::CustomResourceExt>::crd()).unwrap();
        let replicas =
            &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["replicas"];
        assert_eq!(replicas["minimum"].as_f64(), Some(f64::from(REPLICAS_MIN)));
        assert_eq!(replicas["maximum"].as_f64(), Some(f64::from(REPLICAS_MAX)));
        assert!(
            policy
                .contains(&format!("{REPLICAS_MIN} <= object.spec.replicas && object.spec.replicas <= {REPLICAS_MAX}"))
        );
    }
}
