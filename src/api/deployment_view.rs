//! A Deployment as the caches keep it: the few fields a sync reads.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::{Metadata, NamespaceResourceScope};
use serde::{Deserialize, Serialize};

use crate::api::deployment::has_managed_label;
use crate::api::foo::DEFAULT_REPLICAS;
use crate::api::shard::FollowedLabels;

/// What a sync reads of a Deployment: its metadata (identity, owners,
/// resourceVersion), the replicas it asks for and those available. The
/// Deployment watch decodes straight into this type — an `apps/v1`
/// Deployment to the API server — so the pod template, most of a
/// Deployment (k8s-openapi's `Deployment` is 2.4 KB before any of its
/// strings), is skipped while parsing and never kept.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeploymentView {
    /// Read without annotations, finalizers, managedFields and owners other
    /// than the controller ([`crate::api::wire::metadata`]).
    #[serde(deserialize_with = "crate::api::wire::metadata")]
    pub(crate) metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) spec: Option<ViewSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) status: Option<ViewStatus>,
    /// Our managed-by label was on it when the cache dropped its labels
    /// ([`crate::cache::trim_deployment`]): one bool instead of a map per
    /// Deployment. Read through [`DeploymentView::is_managed`].
    #[serde(skip)]
    pub(crate) managed: bool,
    /// The shard labels it carried, once the cache dropped its labels
    /// ([`crate::cache::trim_deployment`]): one map its shard's Deployments
    /// share. `None` on a view that keeps its labels (read afresh).
    #[serde(skip)]
    pub(crate) shard_labels: Option<Arc<FollowedLabels>>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct ViewSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) replicas: Option<i32>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ViewStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) available_replicas: Option<i32>,
}

impl k8s_openapi::Resource for DeploymentView {
    const API_VERSION: &'static str = <Deployment as k8s_openapi::Resource>::API_VERSION;
    const GROUP: &'static str = <Deployment as k8s_openapi::Resource>::GROUP;
    const KIND: &'static str = <Deployment as k8s_openapi::Resource>::KIND;
    const VERSION: &'static str = <Deployment as k8s_openapi::Resource>::VERSION;
    const URL_PATH_SEGMENT: &'static str = <Deployment as k8s_openapi::Resource>::URL_PATH_SEGMENT;
    type Scope = NamespaceResourceScope;
}

impl Metadata for DeploymentView {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The view of a Deployment the API server returned to a write or a read.
impl From<Deployment> for DeploymentView {
    fn from(d: Deployment) -> Self {
        DeploymentView {
            metadata: d.metadata,
            spec: d.spec.map(|s| ViewSpec { replicas: s.replicas }),
            status: d.status.map(|s| ViewStatus { available_replicas: s.available_replicas }),
            managed: false,
            shard_labels: None,
        }
    }
}

impl DeploymentView {
    /// Replicas the Deployment asks for. The API server defaults an unset
    /// value to 1, so unset reads as 1 — as upstream reads
    /// `*deployment.Spec.Replicas`.
    pub(crate) fn spec_replicas(&self) -> i32 {
        self.spec.as_ref().and_then(|s| s.replicas).unwrap_or(DEFAULT_REPLICAS)
    }

    /// True when it carries our managed-by label (or did, before the cache
    /// trimmed its labels away), so our label-filtered watch sees it.
    pub(crate) fn is_managed(&self) -> bool {
        self.managed || has_managed_label(self)
    }

    /// The `followed` labels whose value on this Deployment differs from its
    /// Foo's, each with the Foo's value (`None`: remove it). Empty when the
    /// Deployment is in its Foo's shard.
    pub(crate) fn relabelling(&self, followed: &FollowedLabels) -> FollowedLabels {
        let carried = |key: &String| match &self.shard_labels {
            Some(kept) => kept.get(key).and_then(Option::as_ref),
            None => self.metadata.labels.as_ref().and_then(|l| l.get(key)),
        };
        followed.iter().filter(|(k, v)| carried(k) != v.as_ref()).map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    /// `status.availableReplicas`, 0 when not reported yet.
    pub(crate) fn available_replicas(&self) -> i32 {
        self.status.as_ref().and_then(|s| s.available_replicas).unwrap_or(0)
    }
}
