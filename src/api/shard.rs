//! Label shards, the Flux way: an instance started with
//! `--shard-selector 'shard=a'` owns only the Foos whose labels match, and
//! elects its own leader through a Lease named after the selector, so that
//! several instances split one cluster's Foos between them, each with its
//! own standby. A Foo's Deployment carries the Foo's values of the labels
//! the selector names ([`Shard::follow`]), so the instance's Deployment watch
//! is narrowed by the same selector and caches only its own shard's
//! Deployments; a Foo relabelled into another shard has its Deployment
//! relabelled by the shard that takes it.
//!
//! The selector is read with Kubernetes' grammar
//! ([`crate::client::label_selector`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use kube::core::{Expression, Selector};

use crate::api::constants::{LABEL_APP, LABEL_CONTROLLER, LABEL_MANAGED_BY};
use crate::client::label_selector::{self, key_of};

/// The labels of a Foo its Deployment follows: each key the selector names,
/// with the Foo's value, or `None` where the Foo lacks it (the Deployment
/// must lack it too).
pub(crate) type FollowedLabels = BTreeMap<String, Option<String>>;

/// No shard: every Foo, and no label followed (the tests' default).
#[cfg(any(test, feature = "test-fixtures"))]
pub const UNSHARDED: &FollowedLabels = &BTreeMap::new();

/// The Foos this instance owns: all of them, or those a label selector picks.
#[derive(Clone, Debug, PartialEq)]
pub struct Shard {
    selector: Option<Selector>,
    /// The label keys the selector names, which Deployments follow.
    keys: BTreeSet<String>,
    /// The followed labels when the selector fixes each key's value (`key=v`,
    /// `!key`, as the Flux way shards): every object its watches deliver
    /// carries exactly these, so the caches need not keep them per object
    /// ([`Shard::trim_labels`]). `None` when a requirement admits several.
    fixed: Option<Arc<FollowedLabels>>,
    /// Every followed key absent: what the Deployments of Foos without the
    /// labels share when the selector admits that (`shard notin (a,b)`).
    absent: Arc<FollowedLabels>,
}

impl Default for Shard {
    fn default() -> Self {
        Shard::all()
    }
}

impl Shard {
    /// Every Foo: no `--shard-selector`.
    pub fn all() -> Self {
        Shard { selector: None, keys: BTreeSet::new(), fixed: Some(Arc::default()), absent: Arc::default() }
    }

    /// Parse a label selector as `kubectl -l` takes it. Keys the controller
    /// puts on Deployments itself cannot shard: the Deployment could not
    /// carry both its own value and the Foo's.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut expressions = label_selector::parse(text)?;
        // One spelling per selector, whatever the order it was written in:
        // the Lease is named after it.
        expressions.sort();
        expressions.dedup();
        if expressions.is_empty() {
            return Err("the shard selector is empty; leave the flag out to reconcile every Foo".to_owned());
        }
        let keys: BTreeSet<String> = expressions.iter().map(|e| key_of(e).to_owned()).collect();
        if let Some(taken) = keys.iter().find(|k| [LABEL_APP, LABEL_CONTROLLER, LABEL_MANAGED_BY].contains(&k.as_str()))
        {
            return Err(format!(
                "the label {taken:?} is set on Deployments by the controller and cannot select a shard"
            ));
        }
        let fixed = fixed_labels(&keys, &expressions).map(Arc::new);
        let absent = Arc::new(keys.iter().map(|k| (k.clone(), None)).collect());
        Ok(Shard { selector: Some(Selector::from_iter(expressions)), keys, fixed, absent })
    }

    /// The selector for the API server's lists and watches; `None` for all.
    pub(crate) fn selector(&self) -> Option<String> {
        self.selector.as_ref().map(Selector::to_string)
    }

    /// `selector` narrowed to this shard: both must match.
    pub(crate) fn narrow(&self, selector: &str) -> String {
        match self.selector() {
            Some(shard) => format!("{selector},{shard}"),
            None => selector.to_owned(),
        }
    }

    /// The label keys the Deployments follow.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(String::as_str)
    }

    /// True when a label with this key is one the Deployments follow.
    pub(crate) fn is_followed(&self, key: &str) -> bool {
        self.keys.contains(key)
    }

    /// The labels a Foo's Deployment must carry (or lack) to stay in the
    /// Foo's shard: the Foo's values of the keys the selector names.
    pub(crate) fn follow(&self, foo_labels: Option<&BTreeMap<String, String>>) -> FollowedLabels {
        self.keys.iter().map(|k| (k.clone(), foo_labels.and_then(|l| l.get(k)).cloned())).collect()
    }

    /// Trim a cached Foo's labels to what [`Shard::follow_cached`] reads back:
    /// the followed ones only, and none at all when they are the ones the
    /// selector fixes. A map of one label is a 544-byte tree node, over a
    /// KiB per Foo with its Deployment's; every object a `shard=a` watch
    /// delivers carries `shard=a`, so that is not worth keeping. Trim once,
    /// what the API server sent: a trimmed `None` trimmed again would read
    /// as "no shard label".
    pub(crate) fn trim_labels(&self, labels: &mut Option<BTreeMap<String, String>>) {
        let mut kept = labels.take().unwrap_or_default();
        kept.retain(|k, _| self.is_followed(k));
        let implied = match &self.fixed {
            Some(fixed) => carries(Some(&kept), fixed),
            None => kept.is_empty(),
        };
        // An empty map allocates nothing: `Some` of one says "none of the
        // fixed labels" (an own write racing a relabel), exactly.
        *labels = (!implied).then_some(kept);
    }

    /// [`Shard::follow`] for labels trimmed by [`Shard::trim_labels`].
    pub(crate) fn follow_cached(&self, labels: Option<&BTreeMap<String, String>>) -> FollowedLabels {
        match (labels, &self.fixed) {
            (None, Some(fixed)) => (**fixed).clone(),
            _ => self.follow(labels),
        }
    }

    /// The followed labels of a cached Deployment, shared by every one that
    /// carries the fixed labels, or none of the followed ones (one pointer
    /// each instead of a map); a map of its own otherwise.
    pub(crate) fn follow_shared(&self, labels: Option<&BTreeMap<String, String>>) -> Arc<FollowedLabels> {
        match &self.fixed {
            Some(fixed) if carries(labels, fixed) => fixed.clone(),
            _ if carries(labels, &self.absent) => self.absent.clone(),
            _ => Arc::new(self.follow(labels)),
        }
    }

    /// The leader-election Lease of this shard: `base` without a selector,
    /// else `base`, the selector spelt as a DNS name and a hash of the
    /// selector (`shard=a` → `base-shard-a-<hash>`, `!shard` →
    /// `base-not-shard-<hash>`), so that each shard elects its own leader and
    /// the name says which shard it is. The hash tells apart selectors the
    /// spelling folds together (`shard=A`, `shard=a`); the requirements are
    /// sorted first, so their order does not matter.
    pub fn lease_name(&self, base: &str) -> Result<String, String> {
        let Some(selector) = &self.selector else { return Ok(base.to_owned()) };
        let words: Vec<String> = selector.clone().into_iter().flat_map(|e| spelt(&e)).collect();
        let mut name = base.to_owned();
        for word in words {
            let word = dns_word(&word);
            if !word.is_empty() {
                name.push('-');
                name.push_str(&word);
            }
        }
        let digest = ring::digest::digest(&ring::digest::SHA256, selector.to_string().as_bytes());
        name.push('-');
        name.extend(digest.as_ref()[..4].iter().map(|b| format!("{b:02x}")));
        if name.len() > 253 {
            return Err(format!(
                "the Lease name derived from the shard selector, {name:?}, is longer than 253 characters; shorten --leader-election-id or the selector"
            ));
        }
        Ok(name)
    }
}

/// True when `labels` has each followed key's value in `followed` (`None`:
/// lacks it): `follow(labels) == *followed` without building the map, on
/// every watch event of the caches.
fn carries(labels: Option<&BTreeMap<String, String>>, followed: &FollowedLabels) -> bool {
    followed.iter().all(|(k, v)| labels.and_then(|l| l.get(k)) == v.as_ref())
}

/// The value each key must have (`None`: absent) when every key has one
/// requirement that fixes it: `key=v`, `key in (v)` or `!key`.
fn fixed_labels(keys: &BTreeSet<String>, expressions: &[Expression]) -> Option<FollowedLabels> {
    keys.iter()
        .map(|key| {
            let value = expressions.iter().find_map(|e| match e {
                Expression::Equal(k, v) if k == key => Some(Some(v.clone())),
                Expression::In(k, vs) if k == key && vs.len() == 1 => Some(vs.first().cloned()),
                Expression::DoesNotExist(k) if k == key => Some(None),
                _ => None,
            })?;
            Some((key.clone(), value))
        })
        .collect()
}

/// An expression as the words of its Lease name.
fn spelt(e: &Expression) -> Vec<String> {
    match e {
        Expression::Exists(k) => vec![k.clone()],
        Expression::DoesNotExist(k) => vec!["not".into(), k.clone()],
        Expression::Equal(k, v) => vec![k.clone(), v.clone()],
        Expression::NotEqual(k, v) => vec![k.clone(), "not".into(), v.clone()],
        Expression::In(k, vs) => [k.clone(), "in".into()].into_iter().chain(vs.iter().cloned()).collect(),
        Expression::NotIn(k, vs) => [k.clone(), "notin".into()].into_iter().chain(vs.iter().cloned()).collect(),
    }
}

/// Lower case letters and digits, every other run of characters one `-`.
fn dns_word(word: &str) -> String {
    let lowered = word.to_ascii_lowercase();
    lowered.split(|c: char| !c.is_ascii_alphanumeric()).filter(|part| !part.is_empty()).collect::<Vec<_>>().join("-")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn selectors_in_kubectls_grammar_are_read_and_spelt_back_for_the_api_server() {
        let cases = [
            ("shard=a", "shard=a"),
            ("shard==a", "shard=a"),
            (" !shard ", "!shard"),
            ("shard", "shard"),
            ("shard!=a", "shard!=a"),
            ("shard in (b, a)", "shard in (a,b)"),
            ("tier=gold,example.com/shard notin (a)", "example.com/shard notin (a),tier=gold"),
        ];
        for (given, sent) in cases {
            assert_eq!(Shard::parse(given).unwrap().selector().as_deref(), Some(sent), "{given}");
        }
        assert_eq!(Shard::all().selector(), None);
    }

    #[test]
    fn a_bad_selector_is_refused_with_what_is_wrong() {
        for (given, says) in [
            ("", "the shard selector is empty"),
            (" ", "the shard selector is empty"),
            ("shard in (a", "unbalanced"),
            ("shard=a)", "unbalanced"),
            ("shard=a b", "not a label value"),
            ("Bad_/x=1", "not a label key"),
            ("shard within (a)", "expected `key in"),
            ("-shard", "not a label key"),
            ("shard=a,", "an empty requirement"),
            ("shard>1", "not supported"),
            ("app=nginx", "set on Deployments by the controller"),
            ("!app.kubernetes.io/managed-by", "set on Deployments by the controller"),
        ] {
            let err = Shard::parse(given).unwrap_err();
            assert!(err.contains(says), "{given:?}: {err}");
        }
    }

    /// A key's DNS prefix takes lower-case letters, digits and dashes
    /// (cargo-mutants: no test had a digit in a prefix).
    #[test]
    fn a_key_prefix_may_hold_digits_and_dashes() {
        for key in ["team2.example.com/shard", "a-1.b/shard", "0.io/shard"] {
            assert!(Shard::parse(&format!("{key}=a")).is_ok(), "{key}");
        }
        assert!(Shard::parse("Team.example.com/shard=a").is_err(), "no upper case in a prefix");
    }

    #[test]
    fn a_deployment_follows_the_foos_values_of_the_keys_the_selector_names_and_no_others() {
        let shard = Shard::parse("shard in (a,b),!tier").unwrap();
        let followed = shard.follow(Some(&labels(&[("shard", "b"), ("team", "x")])));
        assert_eq!(followed, BTreeMap::from([("shard".into(), Some("b".into())), ("tier".into(), None)]));
        assert_eq!(Shard::all().follow(Some(&labels(&[("shard", "b")]))), *UNSHARDED);
    }

    #[test]
    fn trimmed_labels_read_back_as_the_labels_they_were_trimmed_from() {
        let selectors = [
            "shard=a",
            "!shard",
            "shard=a,!tier",
            "shard in (a)",
            "shard in (a,b)",
            "shard",
            "shard!=a",
            "tier,shard=a",
        ];
        let objects = [
            labels(&[("shard", "a"), ("team", "x")]),
            labels(&[("shard", "b")]),
            labels(&[("team", "x")]),
            labels(&[("shard", "a"), ("tier", "gold")]),
            labels(&[]),
        ];
        for selector in selectors {
            let shard = Shard::parse(selector).unwrap();
            for object in &objects {
                let mut trimmed = Some(object.clone());
                shard.trim_labels(&mut trimmed);
                assert_eq!(shard.follow_cached(trimmed.as_ref()), shard.follow(Some(object)), "{selector} {object:?}");
                assert!(trimmed.iter().flatten().all(|(k, _)| shard.is_followed(k)), "{selector}: only followed keys");
            }
        }
        let mut all = Some(labels(&[("shard", "a")]));
        Shard::all().trim_labels(&mut all);
        assert_eq!(all, None);
    }

    #[test]
    fn a_shard_that_fixes_its_labels_keeps_none_per_object_it_selects() {
        for (selector, selected) in
            [("shard=a", labels(&[("shard", "a"), ("team", "x")])), ("!shard", labels(&[("team", "x")]))]
        {
            let shard = Shard::parse(selector).unwrap();
            let mut trimmed = Some(selected);
            shard.trim_labels(&mut trimmed);
            assert_eq!(trimmed, None, "{selector}: implied by the watch's selector");
        }
        let fixed = Shard::parse("shard=a").unwrap();
        let mut moved = Some(labels(&[("shard", "b")]));
        fixed.trim_labels(&mut moved);
        assert_eq!(moved, Some(labels(&[("shard", "b")])), "an object the selector no longer matches keeps its own");
        let set = Shard::parse("shard in (a,b)").unwrap();
        let mut in_set = Some(labels(&[("shard", "a")]));
        set.trim_labels(&mut in_set);
        assert_eq!(in_set, Some(labels(&[("shard", "a")])), "several values admitted: each object says which");
    }

    /// Each key's value is fixed by its own requirement alone; one key
    /// left open (several values, or any) leaves the shard unfixed
    /// (cargo-mutants: no test had two keys or a one-value set).
    #[test]
    fn a_selector_fixes_its_labels_only_when_every_key_has_one_value_or_none() {
        let fixed = |selector: &str| Shard::parse(selector).unwrap().fixed.map(|f| (*f).clone());
        let map = |pairs: &[(&str, Option<&str>)]| -> FollowedLabels {
            pairs.iter().map(|(k, v)| ((*k).to_owned(), v.map(str::to_owned))).collect()
        };
        assert_eq!(fixed("shard=a,!team"), Some(map(&[("shard", Some("a")), ("team", None)])));
        assert_eq!(fixed("team=x,shard in (a)"), Some(map(&[("shard", Some("a")), ("team", Some("x"))])));
        assert_eq!(fixed("!shard,team in (x)"), Some(map(&[("shard", None), ("team", Some("x"))])));
        for open in
            ["shard=a,team", "!team,shard", "shard in (a,b),team=x", "shard=a,team!=x", "shard=a,team notin (x)"]
        {
            assert_eq!(fixed(open), None, "{open}: one key admits several values");
        }
    }

    #[test]
    fn the_deployments_of_a_fixed_shard_share_one_map_of_followed_labels() {
        let shard = Shard::parse("shard=a").unwrap();
        let a = labels(&[("shard", "a"), ("app", "nginx")]);
        let (one, two) = (shard.follow_shared(Some(&a)), shard.follow_shared(Some(&a)));
        assert!(Arc::ptr_eq(&one, &two));
        assert_eq!(*one, BTreeMap::from([("shard".into(), Some("a".into()))]));
        let other = shard.follow_shared(Some(&labels(&[("shard", "b")])));
        assert_eq!(*other, BTreeMap::from([("shard".into(), Some("b".into()))]), "its own when it differs");
        let unsharded = Shard::all();
        assert!(Arc::ptr_eq(&unsharded.follow_shared(Some(&a)), &unsharded.follow_shared(None)));
        let rest = Shard::parse("shard notin (a,b)").unwrap();
        let unlabelled = labels(&[("app", "nginx")]);
        assert!(
            Arc::ptr_eq(&rest.follow_shared(Some(&unlabelled)), &rest.follow_shared(None)),
            "no shard label: shared"
        );
        assert_eq!(*rest.follow_shared(None), BTreeMap::from([("shard".into(), None)]));
    }

    #[test]
    fn each_shard_has_a_lease_of_its_own_named_after_its_selector() {
        let lease = |s: &str| Shard::parse(s).unwrap().lease_name("sample-controller").unwrap();
        assert_eq!(Shard::all().lease_name("sample-controller").unwrap(), "sample-controller");
        let spelt = |s: &str| lease(s).rsplit_once('-').unwrap().0.to_owned();
        assert_eq!(spelt("shard=a"), "sample-controller-shard-a");
        assert_eq!(spelt("!shard"), "sample-controller-not-shard");
        assert_eq!(spelt("shard"), "sample-controller-shard");
        assert_eq!(spelt("shard!=a"), "sample-controller-shard-not-a");
        assert_eq!(spelt("example.com/Shard in (A,b)"), "sample-controller-example-com-shard-in-a-b");
        assert_eq!(lease("shard=a").len(), "sample-controller-shard-a-".len() + 8, "8 hex digits of hash");
        let names: BTreeSet<String> =
            ["shard=a", "shard=b", "!shard", "shard", "shard!=a", "shard=A", "shard in (a,b)", "shard in (a-b)"]
                .map(lease)
                .into();
        assert_eq!(names.len(), 8, "distinct shards, distinct Leases, even where their spelling folds together");
        assert_eq!(lease("shard=a,tier=x"), lease("tier=x, shard=a"), "the order of requirements does not matter");
        let long = format!("k={}", "v".repeat(63));
        assert!(Shard::parse(&long).unwrap().lease_name(&"x".repeat(200)).unwrap_err().contains("253"));
    }

    #[test]
    fn narrowing_adds_the_shard_to_a_selector() {
        assert_eq!(Shard::parse("!shard").unwrap().narrow("managed=yes"), "managed=yes,!shard");
        assert_eq!(Shard::all().narrow("managed=yes"), "managed=yes");
    }
}
