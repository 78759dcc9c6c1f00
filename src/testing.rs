//! Builders of Foos and Deployments as the API server returns them, shared
//! by the unit tests and the mocked-API tests. Not part of the API.

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::deployment::desired_deployment;
use crate::foo::{Foo, FooSpec};

/// A Foo as the API server would return it: namespaced, with uid and
/// generation.
pub fn foo(name: &str, deployment_name: &str, replicas: Option<i32>) -> Foo {
    let mut foo = Foo::new(name, FooSpec { deployment_name: deployment_name.into(), replicas });
    foo.metadata.namespace = Some("default".into());
    foo.metadata.uid = Some(format!("uid-{name}"));
    foo.metadata.generation = Some(1);
    foo.metadata.resource_version = Some("100".into());
    foo
}

/// The Deployment the controller made for `foo`, as stored: `replicas` in
/// spec, `available` in status.
pub fn owned_deployment(foo: &Foo, replicas: i32, available: i32) -> Deployment {
    let mut d = desired_deployment(foo).expect("foo must be valid");
    d.metadata.uid = Some(format!("uid-deploy-{}", foo.spec.deployment_name));
    d.metadata.resource_version = Some("200".into());
    d.spec.as_mut().unwrap().replicas = Some(replicas);
    d.status = Some(DeploymentStatus { available_replicas: Some(available), ..Default::default() });
    d
}

/// A Deployment someone else made, with an ownerReference to something that
/// is not a Foo.
pub fn foreign_deployment(name: &str, replicas: i32) -> Deployment {
    Deployment {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some(format!("uid-foreign-{name}")),
            resource_version: Some("300".into()),
            owner_references: Some(vec![OwnerReference {
                api_version: "example.com/v1".into(),
                kind: "Other".into(),
                name: "other".into(),
                uid: "uid-other".into(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        },
        spec: Some(DeploymentSpec { replicas: Some(replicas), ..DeploymentSpec::default() }),
        status: None,
    }
}
