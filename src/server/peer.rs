//! Who may call: the peer's uid from `SO_PEERCRED`, checked at accept time.
//!
//! xfn serves from inside its own user namespace, and the kernel reports a
//! peer's uid *as seen from the reader's namespace*: a caller whose host uid
//! the namespace maps appears as its inside uid, and every caller the
//! namespace does not map appears as the overflow uid (65534) — host root
//! included, when xfn runs rootless and maps only its own uid. So the policy
//! translates the seen uid back to the host through `/proc/self/uid_map` and
//! decides on host uids; a caller seen as the overflow uid cannot be
//! identified and is always refused, whatever `--allow-uid` says.
use std::collections::BTreeSet;
use std::path::Path;

/// Errors reading the namespace's id map.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// `/proc/self/uid_map` or the overflow uid could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The map has a line that is not three numbers.
    #[error("malformed uid_map line {0:?}")]
    Malformed(String),
}

/// One user namespace's uid map: inside uid ranges and the parent's uids
/// they stand for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UidMap {
    ranges: Vec<(u32, u32, u32)>,
}

impl UidMap {
    /// Parses the text of a `uid_map` file (`inside outside count` lines).
    pub fn parse(text: &str) -> Result<Self, PeerError> {
        let mut ranges = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let fields: Vec<u32> = line
                .split_whitespace()
                .map(str::parse)
                .collect::<Result<_, _>>()
                .map_err(|_| PeerError::Malformed(line.to_string()))?;
            match fields.as_slice() {
                [inside, outside, count] => ranges.push((*inside, *outside, *count)),
                _ => return Err(PeerError::Malformed(line.to_string())),
            }
        }
        Ok(Self { ranges })
    }

    /// The map of the namespace this process is in (relative to its parent).
    pub fn of_self() -> Result<Self, PeerError> {
        let path = "/proc/self/uid_map";
        let text = std::fs::read_to_string(path).map_err(|source| PeerError::Read {
            path: path.into(),
            source,
        })?;
        Self::parse(&text)
    }

    /// The parent namespace's uid for `inside`, if mapped.
    pub fn to_host(&self, inside: u32) -> Option<u32> {
        self.ranges.iter().find_map(|&(start, outside, count)| {
            let offset = inside.checked_sub(start)?;
            (u64::from(offset) < u64::from(count)).then(|| outside.wrapping_add(offset))
        })
    }
}

/// The kernel's overflow uid: what unmapped ids read as.
pub fn overflow_uid() -> Result<u32, PeerError> {
    let path = Path::new("/proc/sys/kernel/overflowuid");
    let text = std::fs::read_to_string(path).map_err(|source| PeerError::Read {
        path: path.display().to_string(),
        source,
    })?;
    text.trim()
        .parse()
        .map_err(|_| PeerError::Malformed(text.trim().to_string()))
}

/// Why a caller was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Refused {
    /// The caller is not mapped into xfn's user namespace.
    #[error("caller appears as the overflow uid {0}: its uid is not mapped into xfn's user namespace, so it cannot be identified")]
    Unidentifiable(u32),
    /// The caller is known but not allowed.
    #[error("caller host uid {host} (uid {seen} in xfn's namespace) is not allowed (allowed: {allowed:?}; widen with --allow-uid)")]
    NotAllowed {
        /// Uid as seen.
        seen: u32,
        /// Uid on the host.
        host: u32,
        /// Allowed host uids.
        allowed: Vec<u32>,
    },
}

/// The uids allowed to call, on the host.
#[derive(Debug, Clone)]
pub struct CallerPolicy {
    allowed: BTreeSet<u32>,
    map: UidMap,
    overflow: u32,
}

impl CallerPolicy {
    /// Allows `own_host_uid`, root and `extra` host uids, translating seen
    /// uids through `map`.
    pub fn new(map: UidMap, overflow: u32, own_host_uid: u32, extra: &[u32]) -> Self {
        let mut allowed: BTreeSet<u32> = extra.iter().copied().collect();
        allowed.insert(0);
        allowed.insert(own_host_uid);
        Self {
            allowed,
            map,
            overflow,
        }
    }

    /// The policy for this process: its own host uid (translated through
    /// its namespace's map), root, and `extra`.
    pub fn for_self(extra: &[u32]) -> Result<Self, PeerError> {
        let map = UidMap::of_self()?;
        let overflow = overflow_uid()?;
        let seen_self = nix::unistd::geteuid().as_raw();
        let own = map.to_host(seen_self).unwrap_or(seen_self);
        Ok(Self::new(map, overflow, own, extra))
    }

    /// The allowed host uids.
    pub fn allowed(&self) -> Vec<u32> {
        self.allowed.iter().copied().collect()
    }

    /// Decides on a caller seen as `seen` uid; returns its host uid.
    pub fn check(&self, seen: u32) -> Result<u32, Refused> {
        if seen == self.overflow {
            return Err(Refused::Unidentifiable(seen));
        }
        let host = self
            .map
            .to_host(seen)
            .ok_or(Refused::Unidentifiable(seen))?;
        if self.allowed.contains(&host) {
            Ok(host)
        } else {
            Err(Refused::NotAllowed {
                seen,
                host,
                allowed: self.allowed(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IDENTITY: &str = "         0          0 4294967295\n";

    #[test]
    fn parses_and_translates_maps() {
        let map = UidMap::parse("0 65532 1\n1 100000 65536\n").unwrap();
        assert_eq!(map.to_host(0), Some(65532));
        assert_eq!(map.to_host(1), Some(100000));
        assert_eq!(map.to_host(65536), Some(165535));
        assert_eq!(map.to_host(65537), None);
        assert!(UidMap::parse("0 1\n").is_err());
        assert!(UidMap::parse("a b c\n").is_err());
    }

    #[test]
    fn outside_any_namespace_root_and_self_are_allowed() {
        let policy = CallerPolicy::new(UidMap::parse(IDENTITY).unwrap(), 65534, 65532, &[]);
        assert_eq!(policy.check(0), Ok(0));
        assert_eq!(policy.check(65532), Ok(65532));
        assert!(matches!(
            policy.check(1000),
            Err(Refused::NotAllowed { .. })
        ));
        let widened = CallerPolicy::new(UidMap::parse(IDENTITY).unwrap(), 65534, 65532, &[1000]);
        assert_eq!(widened.check(1000), Ok(1000));
    }

    #[test]
    fn rootless_namespace_sees_self_as_root_and_others_as_overflow() {
        // xfn as 65532, mapping only itself to 0.
        let map = UidMap::parse("0 65532 1\n").unwrap();
        let policy = CallerPolicy::new(map, 65534, 65532, &[1000]);
        // The daemon's own uid reads as 0 inside: allowed, as host 65532.
        assert_eq!(policy.check(0), Ok(65532));
        // Host root, or uid 1000, read as the overflow uid: refused, even
        // though 1000 is allowed, because nobody can tell who it is.
        assert_eq!(policy.check(65534), Err(Refused::Unidentifiable(65534)));
    }

    #[test]
    fn ranged_namespace_refuses_subordinate_uids_and_overflow() {
        // xfn as root with --map-root-uid 100000 (and its own uid kept as 0).
        let map = UidMap::parse("0 100000 65536\n").unwrap();
        let policy = CallerPolicy::new(map, 65534, 100000, &[]);
        assert_eq!(policy.check(0), Ok(100000));
        assert!(matches!(
            policy.check(5),
            Err(Refused::NotAllowed { host: 100005, .. })
        ));
        // Inside 65534 is mapped here, but it is also what unmapped callers
        // read as, so it is never trusted.
        assert_eq!(policy.check(65534), Err(Refused::Unidentifiable(65534)));
    }

    #[test]
    fn policy_for_this_process_allows_itself() {
        let policy = CallerPolicy::for_self(&[]).unwrap();
        let me = nix::unistd::geteuid().as_raw();
        assert!(policy.check(me).is_ok());
    }
}
