//! Who may call: the daemon's own uid, root, and `--allow-uid` uids — all
//! host uids, as the gatekeeper (see [`super::gate`]) reads them with
//! `SO_PEERCRED` from outside xfn's user namespace.
use std::collections::BTreeSet;

/// Why a caller was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("caller uid {uid} is not allowed (allowed: {allowed:?}; widen with --allow-uid)")]
pub struct Refused {
    /// The caller's uid.
    pub uid: u32,
    /// The allowed uids.
    pub allowed: Vec<u32>,
}

/// The uids allowed to call.
#[derive(Debug, Clone)]
pub struct CallerPolicy {
    allowed: BTreeSet<u32>,
}

impl CallerPolicy {
    /// Allows `own_uid`, root and `extra`.
    pub fn new(own_uid: u32, extra: &[u32]) -> Self {
        let mut allowed: BTreeSet<u32> = extra.iter().copied().collect();
        allowed.insert(0);
        allowed.insert(own_uid);
        Self { allowed }
    }

    /// The policy for this process (call it before entering the user
    /// namespace, where the own uid still reads as the host's).
    pub fn for_self(extra: &[u32]) -> Self {
        Self::new(nix::unistd::geteuid().as_raw(), extra)
    }

    /// The allowed uids.
    pub fn allowed(&self) -> Vec<u32> {
        self.allowed.iter().copied().collect()
    }

    /// Decides on a caller with host uid `uid`.
    pub fn check(&self, uid: u32) -> Result<(), Refused> {
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
}
