//! The `Foo` API type, `samplecontroller.k8s.io/v1alpha1` — the Rust
//! counterpart of upstream's `pkg/apis/samplecontroller/v1alpha1/types.go`,
//! with the CRD derived instead of generated.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, Resource};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::api::constants::CONDITION_READY;

/// A DNS-1123 subdomain, the rule Kubernetes applies to Deployment names.
/// Checked by the API server so a bad name is refused at `kubectl apply`,
/// not discovered later by a failing reconcile.
pub(crate) const DNS1123_SUBDOMAIN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";

/// What the API server says of a `spec.deploymentName` that is not one.
pub(crate) const MESSAGE_BAD_DEPLOYMENT_NAME: &str = "must be a valid Deployment name: a DNS-1123 subdomain of lowercase letters, digits, '-' and '.', starting and ending with a letter or digit (for example 'example-foo')";

/// Longest Foo name: the name is the value of the `controller` label of its
/// Deployment and pods, and label values have at most 63 characters.
pub(crate) const MAX_NAME_LENGTH: usize = 63;

/// What the API server says of a Foo name longer than [`MAX_NAME_LENGTH`].
// The number is written out (a const cannot be formatted into a const
// &str); a test checks it is MAX_NAME_LENGTH.
pub(crate) const MESSAGE_NAME_TOO_LONG: &str = "metadata.name must be at most 63 characters: it is the value of the 'controller' label on the Foo's Deployment and pods, and label values are limited to 63 characters";

/// The desired state of a Foo: a Deployment of that name with that many
/// replicas.
// clippy reads the repeated `type_` of the printcolumns as duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[kube(
    group = "samplecontroller.k8s.io",
    version = "v1alpha1",
    kind = "Foo",
    plural = "foos",
    shortname = "fo",
    namespaced,
    status = "FooStatus",
    derive = "PartialEq",
    derive = "Default",
    // *.k8s.io groups are protected: the API server refuses a CRD in one
    // without this annotation. Upstream's CRD carries the same value.
    annotation(
        "api-approved.kubernetes.io",
        "unapproved, experimental-only; please get an approval from Kubernetes API reviewers if you're trying to develop a CRD in the *.k8s.io or *.kubernetes.io groups"
    ),
    doc = "A Foo owns an nginx Deployment named spec.deploymentName with spec.replicas replicas.",
    validation = Rule::new(format!("size(self.metadata.name) <= {MAX_NAME_LENGTH}")).message(MESSAGE_NAME_TOO_LONG),
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.availableReplicas"
    ),
    printcolumn(name = "Deployment", type_ = "string", json_path = ".spec.deploymentName"),
    printcolumn(name = "Desired", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "Available", type_ = "integer", json_path = ".status.availableReplicas"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct FooSpec {
    /// Name of the Deployment this Foo owns, in the Foo's namespace. Must be
    /// a DNS-1123 subdomain, like every Deployment name.
    #[schemars(length(min = 1, max = 253))]
    #[schemars(extend("x-kubernetes-validations" = [{
        // CEL's string literal: a regex backslash is written twice.
        "rule": format!("self.matches('{}')", DNS1123_SUBDOMAIN.replace('\\', "\\\\")),
        "message": MESSAGE_BAD_DEPLOYMENT_NAME,
    }]))]
    pub deployment_name: String,

    /// Desired replicas of the Deployment, 1 to 10. When unset, the
    /// Deployment's own replicas are left alone (the API server defaults a
    /// new Deployment to 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = REPLICAS_MIN, max = REPLICAS_MAX))]
    pub replicas: Option<i32>,
}

/// The bounds of `spec.replicas`, which the API server checks (the CRD's
/// schema) and which also bound what the operator's ServiceAccount may
/// give a Deployment (its confinement, [`crate::api::confinement`]).
pub(crate) const REPLICAS_MIN: i32 = 1;
pub(crate) const REPLICAS_MAX: i32 = 10;

/// The API server's default replicas for a Deployment that sets none:
/// what a Foo without `spec.replicas` gets, and what an unset field reads as.
pub(crate) const DEFAULT_REPLICAS: i32 = 1;

impl FooSpec {
    /// The replicas a new Deployment for this Foo has.
    pub fn desired_replicas(&self) -> i32 {
        self.replicas.unwrap_or(DEFAULT_REPLICAS)
    }
}

/// The observed state of a Foo, written only through the status subresource.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FooStatus {
    /// Available replicas of the owned Deployment (upstream's only field).
    #[serde(default)]
    pub available_replicas: i32,

    /// The `metadata.generation` of the Foo this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `Ready`: True when the Deployment is owned by this Foo and has the
    /// desired replicas; False with a reason saying why not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

impl FooStatus {
    /// The part of this status the controller owns: its fields and its own
    /// condition, without the conditions other writers keep there.
    pub fn owned_by_controller(&self) -> FooStatus {
        FooStatus {
            available_replicas: self.available_replicas,
            observed_generation: self.observed_generation,
            conditions: self.conditions.iter().filter(|c| Self::owns(c)).cloned().collect(),
        }
    }

    /// Drop the conditions other writers keep here, in place.
    pub fn keep_owned_by_controller(&mut self) {
        self.conditions.retain(Self::owns);
    }

    fn owns(condition: &Condition) -> bool {
        condition.type_ == CONDITION_READY
    }
}

/// Whether a Foo's newest generation has its status written: its
/// `status.observedGeneration` has caught up (a Foo being deleted has
/// nothing left to sync). From the three fields, so that a cache can ask it
/// without building the Foo.
pub(crate) fn status_caught_up(generation: Option<i64>, observed: Option<i64>, deleting: bool) -> bool {
    deleting || observed >= generation
}

impl Foo {
    /// A server-side apply of `status` to the status subresource of the Foo
    /// `name`: the identity the API server needs and nothing of the spec.
    pub fn status_apply(name: &str, status: FooStatus) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": Foo::api_version(&()),
            "kind": Foo::kind(&()),
            "metadata": { "name": name },
            "status": status,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn condition(type_: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: "True".into(),
            reason: "R".into(),
            message: String::new(),
            observed_generation: Some(3),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
        }
    }

    #[test]
    fn the_status_applied_is_ours_only_with_identity_and_no_spec() {
        let status = FooStatus {
            available_replicas: 2,
            observed_generation: Some(3),
            conditions: vec![condition("BackedUp"), condition(CONDITION_READY), condition("Audited")],
        };
        let ours = status.owned_by_controller();
        assert_eq!((ours.available_replicas, ours.observed_generation), (2, Some(3)));
        assert_eq!(ours.conditions, vec![condition(CONDITION_READY)], "other writers' conditions are not ours");
        let apply = Foo::status_apply("example-foo", ours);
        assert_eq!(apply["apiVersion"], "samplecontroller.k8s.io/v1alpha1");
        assert_eq!((apply["kind"].as_str(), apply["metadata"]["name"].as_str()), (Some("Foo"), Some("example-foo")));
        assert_eq!(apply["status"]["availableReplicas"], 2);
        assert!(apply.get("spec").is_none(), "a status apply must not own the spec");
    }

    #[test]
    fn the_name_length_message_names_the_limit() {
        assert_eq!(MESSAGE_NAME_TOO_LONG.matches(&MAX_NAME_LENGTH.to_string()).count(), 2);
    }
    use kube::CustomResourceExt;

    #[test]
    fn crd_is_upstreams_group_kind_and_version_with_kubectl_extras() {
        let crd = Foo::crd();
        assert_eq!(crd.metadata.name.as_deref(), Some("foos.samplecontroller.k8s.io"));
        let annotations = crd.metadata.annotations.unwrap();
        assert!(annotations["api-approved.kubernetes.io"].starts_with("unapproved"));
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(crd.spec.names.kind, "Foo");
        assert_eq!(crd.spec.names.short_names, Some(vec!["fo".to_owned()]));
        let v = &crd.spec.versions[0];
        assert_eq!(v.name, "v1alpha1");
        let sub = v.subresources.as_ref().unwrap();
        assert!(sub.status.is_some());
        assert_eq!(sub.scale.as_ref().unwrap().spec_replicas_path, ".spec.replicas");
        let columns: Vec<_> = v.additional_printer_columns.as_ref().unwrap().iter().map(|c| c.name.as_str()).collect();
        assert_eq!(columns, ["Deployment", "Desired", "Available", "Age"]);
    }

    #[test]
    fn spec_serializes_camel_case_like_upstream() {
        let spec = FooSpec { deployment_name: "example-foo".into(), replicas: Some(1) };
        assert_eq!(
            serde_json::to_value(&spec).unwrap(),
            serde_json::json!({ "deploymentName": "example-foo", "replicas": 1 })
        );
    }
}
