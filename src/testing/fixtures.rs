//! Builders of Foos and Deployments as the API server returns them.
//!
//! ```
//! # use k8s_openapi::api::apps::v1::Deployment;
//! # use sample_controller::Foo;
//! # use sample_controller::testing::{DeploymentFixture, FooFixture};
//! let foo = Foo::test("example-foo").replicas(3);
//! let ours = Deployment::owned_by(&foo).replicas(1).available(1);
//! let theirs = Deployment::foreign("example-foo");
//! # assert_eq!(ours.spec.unwrap().replicas, Some(1));
//! # assert_eq!(theirs.metadata.name.as_deref(), Some("example-foo"));
//! ```

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::api::deployment::desired_deployment;
use crate::api::deployment_view::DeploymentView;
use crate::api::foo::{Foo, FooSpec};
use crate::api::shard::UNSHARDED;
use crate::cache::{Cache, Keep};

/// Builders of Foos.
pub trait FooFixture: Sized {
    /// A Foo as the API server would return it: in `default`, with uid
    /// `uid-<name>`, generation 1, naming a Deployment of its own name with
    /// one replica.
    fn test(name: &str) -> Self;
    fn deployment(self, name: &str) -> Self;
    fn replicas(self, replicas: i32) -> Self;
    /// No `spec.replicas`: the Deployment's own are left alone.
    fn unset_replicas(self) -> Self;
    fn generation(self, generation: i64) -> Self;
    fn uid(self, uid: &str) -> Self;
    fn label(self, key: &str, value: &str) -> Self;
}

impl FooFixture for Foo {
    fn test(name: &str) -> Self {
        let mut foo = Foo::new(name, FooSpec { deployment_name: name.into(), replicas: Some(1) });
        foo.metadata.namespace = Some("default".into());
        foo.metadata.uid = Some(format!("uid-{name}"));
        foo.metadata.generation = Some(1);
        foo.metadata.resource_version = Some("100".into());
        foo
    }

    fn deployment(mut self, name: &str) -> Self {
        self.spec.deployment_name = name.into();
        self
    }

    fn replicas(mut self, replicas: i32) -> Self {
        self.spec.replicas = Some(replicas);
        self
    }

    fn unset_replicas(mut self) -> Self {
        self.spec.replicas = None;
        self
    }

    fn generation(mut self, generation: i64) -> Self {
        self.metadata.generation = Some(generation);
        self
    }

    fn uid(mut self, uid: &str) -> Self {
        self.metadata.uid = Some(uid.into());
        self
    }

    fn label(mut self, key: &str, value: &str) -> Self {
        self.metadata.labels.get_or_insert_default().insert(key.into(), value.into());
        self
    }
}

/// The setters of [`DeploymentFixture`]: a Deployment and its view have the
/// same field paths.
macro_rules! fixture_setters {
    () => {
        fn replicas(mut self, replicas: i32) -> Self {
            self.spec.get_or_insert_with(Default::default).replicas = Some(replicas);
            self
        }

        fn available(mut self, available: i32) -> Self {
            self.status.get_or_insert_with(Default::default).available_replicas = Some(available);
            self
        }
    };
}

/// Builders of Deployments.
pub trait DeploymentFixture: Sized {
    /// The Deployment the controller made for `foo`, as stored (uid
    /// `uid-deploy-<name>`, resourceVersion 200), with the Foo's replicas
    /// (or 1) and none available.
    fn owned_by(foo: &Foo) -> Self;
    /// The Deployment upstream's Go controller made for `foo`: as
    /// [`DeploymentFixture::owned_by`], without labels of its own (upstream
    /// labels only the selector and the pods).
    fn made_by_upstream(foo: &Foo) -> Self;
    /// A Deployment someone else made, controlled by something that is not
    /// a Foo, with one replica.
    fn foreign(name: &str) -> Self;
    fn replicas(self, replicas: i32) -> Self;
    fn available(self, available: i32) -> Self;
}

impl DeploymentFixture for Deployment {
    fn owned_by(foo: &Foo) -> Self {
        let mut d = desired_deployment(foo, UNSHARDED).expect("the Foo must be able to own a Deployment");
        d.metadata.uid = Some(format!("uid-deploy-{}", foo.spec.deployment_name));
        d.metadata.resource_version = Some("200".into());
        d.spec.as_mut().unwrap().replicas = Some(foo.spec.desired_replicas());
        d.status = Some(DeploymentStatus { available_replicas: Some(0), ..Default::default() });
        d
    }

    fn made_by_upstream(foo: &Foo) -> Self {
        let mut d = Self::owned_by(foo);
        d.metadata.labels = None;
        d
    }

    fn foreign(name: &str) -> Self {
        let owner = OwnerReference {
            api_version: "example.com/v1".into(),
            kind: "Other".into(),
            name: "other".into(),
            uid: "uid-other".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        };
        Deployment {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                uid: Some(format!("uid-foreign-{name}")),
                resource_version: Some("300".into()),
                owner_references: Some(vec![owner]),
                ..ObjectMeta::default()
            },
            spec: Some(DeploymentSpec { replicas: Some(1), ..DeploymentSpec::default() }),
            status: None,
        }
    }

    fixture_setters!();
}

/// The same Deployments as the controller's cache keeps them.
impl DeploymentFixture for DeploymentView {
    fn owned_by(foo: &Foo) -> Self {
        Deployment::owned_by(foo).into()
    }

    fn made_by_upstream(foo: &Foo) -> Self {
        Deployment::made_by_upstream(foo).into()
    }

    fn foreign(name: &str) -> Self {
        Deployment::foreign(name).into()
    }

    fixture_setters!();
}

/// The value of `series` (name and labels, exactly as exposed, e.g.
/// `controller_runtime_reconcile_total{controller="foo",result="success"}`)
/// in Prometheus text; `None` if it is not there. The one reader of
/// `/metrics` for all tests.
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.split(' ').next()?.parse().ok())
}

/// A cache holding `objects` trimmed by `trim`, as its watch's first list
/// would leave it.
pub async fn filled<K, S>(
    objects: impl IntoIterator<Item = K>,
    trim: impl Fn(&mut K) + Send + Sync + 'static,
) -> std::sync::Arc<Cache<K, S>>
where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static,
    S: Keep<K>,
{
    use futures::StreamExt;
    use kube::runtime::watcher::Event;
    let cache = Cache::new(trim);
    let listed: Vec<_> = objects.into_iter().map(Event::InitApply).collect();
    let events = std::iter::once(Event::Init).chain(listed).chain([Event::InitDone]).map(Ok);
    cache.reflect(futures::stream::iter(events)).for_each(|_| async {}).await;
    cache
}
