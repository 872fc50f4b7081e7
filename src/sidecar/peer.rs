//! Who may call: the daemon's own uid, root, and `--allow-uid` uids — all
//! host uids, as the gatekeeper (see [`super::gate`]) reads them with
//! `SO_PEERCRED` from outside xfn's user namespace.
use std::collections::BTreeSet;

/// Why a caller was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("caller uid {uid} is not allowed (allowed: {allowed:?}; widen with --allow-uid)")]
pub(crate) struct Refused {
    /// The caller's uid.
    pub(crate) uid: u32,
    /// The allowed uids.
    pub(crate) allowed: Vec<u32>,
}

/// The uids allowed to call.
#[derive(Debug, Clone)]
pub(crate) struct CallerPolicy {
    allowed: BTreeSet<u32>,
}

impl CallerPolicy {
    /// Allows `own_uid`, root and `extra`.
    pub(crate) fn new(own_uid: u32, extra: &[u32]) -> Self {
        let mut allowed: BTreeSet<u32> = extra.iter().copied().collect();
        allowed.insert(0);
        allowed.insert(own_uid);
        Self { allowed }
    }

    /// The policy for this process (call it before entering the user
    /// namespace, where the own uid still reads as the host's).
    pub(crate) fn for_self(extra: &[u32]) -> Self {
        Self::new(nix::unistd::geteuid().as_raw(), extra)
    }

    /// The allowed uids.
    pub(crate) fn allowed(&self) -> Vec<u32> {
        self.allowed.iter().copied().collect()
    }

    /// Decides on a caller with host uid `uid`.
    pub(crate) fn check(&self, uid: u32) -> Result<(), Refused> {
        if self.allowed.contains(&uid) {
            Ok(())
        } else {
            Err(Refused {
                uid,
                allowed: self.allowed(),
            })
        }
    }
}

/// Where a caller's process sits relative to the gatekeeper's PID
/// namespace, as the pid `SO_PEERCRED` reports tells it.
///
/// The kernel reports the peer's pid as seen from the reader's PID
/// namespace, and 0 when the peer is not visible there (checked on Linux
/// 6.x: a client in a sibling namespace reads as pid 0, one in a child
/// namespace as its pid in ours). Every function xfn starts runs in a PID
/// namespace of its own, a child of xfn's, so a function (with `NetworkPolicy
/// Runner` it shares the network namespace where the abstract socket lives,
/// and in the own-id mapping even xfn's uid) always shows up visible and
/// deeper than us. Crossplane, in another container of the pod, is invisible;
/// a caller on the same host shares our namespace. Both are judged by uid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PeerPlace {
    /// Not visible from here (pid 0): another container of the pod.
    Invisible,
    /// In the gatekeeper's own PID namespace.
    OurNamespace,
    /// Visible, in a namespace below ours: a container. Never allowed.
    Container,
    /// Its place could not be read (it exited already). Never allowed.
    Unknown,
}

impl PeerPlace {
    /// Where the process `pid` (as `SO_PEERCRED` reported it here) sits:
    /// by the depth of its `NSpid` list (world-readable, unlike
    /// `/proc/PID/ns`) against ours. A visible process at our depth is in
    /// our namespace; deeper, in one below it.
    pub(crate) fn of(pid: i32) -> Self {
        if pid == 0 {
            return Self::Invisible;
        }
        // Ours is read once: a refusal then reads one file, not two.
        static OURS: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
        let ours = *OURS.get_or_init(|| ns_depth("self"));
        match (ours, ns_depth(&pid.to_string())) {
            (Some(ours), Some(theirs)) if theirs == ours => Self::OurNamespace,
            (Some(ours), Some(theirs)) if theirs > ours => Self::Container,
            _ => Self::Unknown,
        }
    }

    /// Whether a caller from here may be judged by its uid at all.
    pub(crate) fn may_call(self) -> bool {
        matches!(self, Self::Invisible | Self::OurNamespace)
    }
}

/// How many PID namespaces `/proc/<pid>` lists the process in.
fn ns_depth(pid: &str) -> Option<usize> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("NSpid:"))
        .map(|pids| pids.split_whitespace().count())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_self_and_listed_uids_are_allowed() {
        let policy = CallerPolicy::new(65532, &[1000]);
        assert_eq!(policy.check(0), Ok(()));
        assert_eq!(policy.check(65532), Ok(()));
        assert_eq!(policy.check(1000), Ok(()));
        let refused = policy.check(1001).unwrap_err();
        assert_eq!(refused.uid, 1001);
        assert_eq!(refused.allowed, vec![0, 1000, 65532]);
    }

    #[test]
    fn by_default_only_root_and_self() {
        let policy = CallerPolicy::new(65532, &[]);
        assert_eq!(policy.allowed(), vec![0, 65532]);
        assert!(policy.check(65534).is_err());
    }

    #[test]
    fn a_caller_in_our_namespace_or_invisible_is_judged_by_uid() {
        assert_eq!(PeerPlace::of(0), PeerPlace::Invisible);
        let me = std::process::id() as i32;
        assert_eq!(PeerPlace::of(me), PeerPlace::OurNamespace);
        assert!(PeerPlace::of(me).may_call());
        assert!(!PeerPlace::Container.may_call());
        assert!(!PeerPlace::Unknown.may_call());
    }
}
