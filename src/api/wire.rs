//! Objects decoded as the caches keep them: of the metadata, only what a
//! sync reads. Anyone who may edit a Foo or a Deployment writes its
//! metadata (finalizers, annotations, and the managedFields entry each
//! write adds), up to the API server's object limit; a watch event or a
//! write's response carrying megabytes of it would otherwise be decoded
//! whole, for [`crate::cache`]'s trim to drop a moment later. Here serde
//! skips those fields as it parses them, without building them.
//!
//! [`FooWire`] is a Foo as the Foo watch and the status write read it;
//! [`crate::api::deployment_view::DeploymentView`]'s metadata is read by
//! [`metadata`] too.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::Resource;
use kube::runtime::watcher;
use serde::de::{Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

use crate::api::foo::{Foo, FooSpec, FooStatus};

/// The metadata a sync reads; serde skips the rest as it parses.
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Slim {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    generation: Option<i64>,
    creation_timestamp: Option<Time>,
    deletion_timestamp: Option<Time>,
    labels: Option<BTreeMap<String, String>>,
    #[serde(default, deserialize_with = "controller_reference")]
    owner_references: Option<OwnerReference>,
}

/// `metadata` as a sync reads it: identity, resourceVersion, generation,
/// creation and deletion, labels, and the controller ownerReference alone
/// (no annotations, finalizers, managedFields or other owners).
pub(crate) fn metadata<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let slim = Slim::deserialize(d)?;
    Ok(ObjectMeta {
        name: slim.name,
        namespace: slim.namespace,
        uid: slim.uid,
        resource_version: slim.resource_version,
        generation: slim.generation,
        creation_timestamp: slim.creation_timestamp,
        deletion_timestamp: slim.deletion_timestamp,
        labels: slim.labels,
        owner_references: slim.owner_references.map(|owner| vec![owner]),
        ..ObjectMeta::default()
    })
}

/// The controller ownerReference of a list of them (the first with
/// `controller: true`), dropping the others as they are read.
pub(crate) fn controller_reference<'de, D: Deserializer<'de>>(d: D) -> Result<Option<OwnerReference>, D::Error> {
    struct Controller;
    impl<'de> Visitor<'de> for Controller {
        type Value = Option<OwnerReference>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a list of ownerReferences")
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut controller = None;
            while let Some(owner) = seq.next_element::<OwnerReference>()? {
                if controller.is_none() && owner.controller == Some(true) {
                    controller = Some(owner);
                }
            }
            Ok(controller)
        }
    }
    d.deserialize_any(Controller)
}

/// A Foo as the API server sends it, its metadata read by [`metadata`]:
/// what the Foo watch decodes, and the status write's response. Encoded
/// again, it is what was kept (a paged list's page:
/// [`crate::client::lists`]).
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct FooWire {
    #[serde(deserialize_with = "metadata")]
    metadata: ObjectMeta,
    spec: FooSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    status: Option<FooStatus>,
}

impl From<FooWire> for Foo {
    fn from(wire: FooWire) -> Foo {
        Foo { metadata: wire.metadata, spec: wire.spec, status: wire.status }
    }
}

/// A Foo to the API server: the same group, version, kind and path.
impl Resource for FooWire {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        Foo::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        Foo::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        Foo::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        Foo::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// A watch event of [`FooWire`]s as one of Foos.
pub(crate) fn foo_event(event: watcher::Event<FooWire>) -> watcher::Event<Foo> {
    use watcher::Event::*;
    match event {
        Apply(foo) => Apply(foo.into()),
        Delete(foo) => Delete(foo.into()),
        Init => Init,
        InitApply(foo) => InitApply(foo.into()),
        InitDone => InitDone,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FooFixture;

    #[test]
    fn a_foo_is_read_without_its_finalizers_annotations_managed_fields_or_other_owners() {
        let mut foo = Foo::test("f");
        let owner = |controller| OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: "cm".into(),
            uid: "uid-cm".into(),
            controller: Some(controller),
            ..OwnerReference::default()
        };
        foo.metadata.owner_references = Some(vec![owner(false), owner(true), owner(false)]);
        foo.metadata.finalizers = Some(vec!["example.com/keep".into(); 3]);
        foo.metadata.annotations = Some([("big".to_owned(), "x".repeat(1000))].into());
        let mut json = serde_json::to_value(&foo).unwrap();
        json["metadata"]["managedFields"] = serde_json::json!([{ "manager": "kubectl", "fieldsV1": { "f:x": {} } }]);
        let read: Foo = serde_json::from_value::<FooWire>(json).unwrap().into();
        assert_eq!(read.metadata.owner_references, Some(vec![owner(true)]));
        let m = &read.metadata;
        assert_eq!((&m.finalizers, &m.annotations, &m.managed_fields), (&None, &None, &None));
        let kept = Foo {
            metadata: ObjectMeta {
                owner_references: None,
                finalizers: None,
                annotations: None,
                ..foo.metadata.clone()
            },
            ..foo
        };
        assert_eq!(
            Foo { metadata: ObjectMeta { owner_references: None, ..read.metadata.clone() }, ..read },
            kept,
            "the rest as sent"
        );
    }

    #[test]
    fn a_foo_without_owners_or_status_is_read() {
        let json = serde_json::json!({
            "apiVersion": "samplecontroller.k8s.io/v1alpha1", "kind": "Foo",
            "metadata": { "name": "f", "namespace": "ns", "ownerReferences": null },
            "spec": { "deploymentName": "d" },
        });
        let read: Foo = serde_json::from_value::<FooWire>(json).unwrap().into();
        assert_eq!((read.metadata.owner_references, read.status), (None, None));
    }
}
