//! Upstream's command line, accepted unchanged: Go's flag package takes long
//! flags with one dash (`-kubeconfig=PATH`), and klog adds `-v=N`,
//! `-logtostderr` and `-alsologtostderr`. [`from_go_style`] rewrites such a
//! command line into the one [`Cli`] parses, before clap sees it.

use clap::CommandFactory;

use crate::observe::telemetry::klog_filter;
use crate::ops::cli::Cli;

/// The command line after [`from_go_style`]: what clap parses, and what
/// was translated on the way.
#[derive(Debug, Default, PartialEq)]
pub struct GoStyleArgs {
    pub args: Vec<String>,
    /// One line per flag that was mapped or ignored, for the log.
    pub notices: Vec<String>,
    /// klog's `-v=N`, as a log filter (used when RUST_LOG is unset).
    pub log_filter: Option<String>,
}

/// klog's boolean flags that upstream's command lines carry and that mean
/// nothing here: logs always go to stderr.
const KLOG_IGNORED: [&str; 2] = ["logtostderr", "alsologtostderr"];

/// Accept upstream's command line unchanged. Go's flag package takes long
/// flags with one dash (`-kubeconfig=PATH`, `-kubeconfig PATH`,
/// `-master=URL`); every long flag of ours is accepted that way too. klog's
/// `-v=N` becomes a log filter; `-logtostderr` and `-alsologtostderr` are
/// dropped. Anything else is left for clap to accept or refuse.
pub fn from_go_style(args: impl IntoIterator<Item = String>) -> GoStyleArgs {
    let ours: Vec<String> = Cli::command().get_arguments().filter_map(|a| a.get_long().map(str::to_owned)).collect();
    let mut out = GoStyleArgs::default();
    let mut args = args.into_iter();
    out.args.extend(args.next()); // the program
    while let Some(arg) = args.next() {
        if arg == "--" {
            out.args.push(arg);
            out.args.extend(args.by_ref());
            break;
        }
        let Some(flag) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
            out.args.push(arg);
            continue;
        };
        let (name, value) = match flag.split_once('=') {
            Some((name, value)) => (name, Some(value.to_owned())),
            None => (flag, None),
        };
        if name == "v" {
            let level = value.or_else(|| args.next()).unwrap_or_default();
            let filter = klog_filter(&level);
            out.notices.push(match &filter {
                Some(f) => format!("-v={level} (klog) maps to RUST_LOG={f}"),
                None => format!("-v={level} (klog) is not a number; ignored"),
            });
            out.log_filter = filter;
        } else if KLOG_IGNORED.contains(&name) {
            out.notices.push(format!("-{flag} (klog) ignored: logs always go to stderr"));
        } else if !arg.starts_with("--") && name.len() > 1 && ours.iter().any(|o| o == name) {
            out.args.push(format!("-{arg}"));
        } else {
            out.args.push(arg);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::telemetry::DEFAULT_FILTER;
    use clap::Parser;

    fn go_style(args: &[&str]) -> GoStyleArgs {
        from_go_style(std::iter::once("sample-controller").chain(args.iter().copied()).map(str::to_owned))
    }

    #[test]
    fn upstreams_readme_command_line_starts_ours() {
        // sample-controller's README: `./sample-controller -kubeconfig=$HOME/.kube/config`
        let go = go_style(&["-kubeconfig=/home/me/.kube/config", "-master=https://10.0.0.1:6443"]);
        assert!(go.notices.is_empty(), "{:?}", go.notices);
        let cli = Cli::try_parse_from(go.args).unwrap();
        assert_eq!(cli.kubeconfig.as_deref(), Some("/home/me/.kube/config"));
        assert_eq!(cli.master, Some("https://10.0.0.1:6443".parse().unwrap()));
        // Go's other form: the value as the next argument.
        let cli = Cli::try_parse_from(go_style(&["-kubeconfig", "/k", "-namespace", "ns"]).args).unwrap();
        assert_eq!((cli.kubeconfig.as_deref(), cli.namespace.as_deref()), (Some("/k"), Some("ns")));
    }

    #[test]
    fn klog_flags_are_mapped_or_ignored_with_a_notice() {
        let go = go_style(&["-v=4", "-logtostderr", "--alsologtostderr=true", "-kubeconfig=/k"]);
        assert_eq!(go.args, ["sample-controller", "--kubeconfig=/k"]);
        assert_eq!(
            go.log_filter,
            Some(format!(
                "{},sample_controller=debug,kube_lease_fence=debug,kube_secure_metrics=debug",
                DEFAULT_FILTER
            ))
        );
        assert_eq!(go.notices.len(), 3, "{:?}", go.notices);
        assert!(go.notices[0].starts_with("-v=4 (klog) maps to RUST_LOG="), "{:?}", go.notices);
        assert_eq!(go.notices[1], "-logtostderr (klog) ignored: logs always go to stderr");
        assert_eq!(go_style(&["-v", "2"]).log_filter.as_deref(), Some(DEFAULT_FILTER));
        assert!(go_style(&["-v=7"]).log_filter.unwrap().ends_with("kube_secure_metrics=trace,kube=debug"));
        assert_eq!(go_style(&["-v=loud"]).log_filter, None);
    }

    #[test]
    fn short_flags_values_and_unknown_flags_are_left_to_clap() {
        let go = go_style(&["-V", "--workers", "-1", "-nonsense=1", "--", "-kubeconfig=x"]);
        assert_eq!(go.args, ["sample-controller", "-V", "--workers", "-1", "-nonsense=1", "--", "-kubeconfig=x"]);
        assert!(Cli::try_parse_from(go_style(&["-nonsense=1"]).args).is_err());
    }
}
