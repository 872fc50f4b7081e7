//! Resolving an image config's `User` (`name`, `uid`, `name:group`,
//! `uid:gid`, …) against the image's own /etc/passwd and /etc/group, and
//! mapping the ids it names into the run's user namespace.
//!
//! Choice: **the image's ids are mapped onto the ids xfn has for its
//! functions** (`userns.rs`). Each run has a user namespace of its own
//! whose ids are xfn's (spec.rs). Where xfn has spare ids (a privileged
//! range, or subordinate ids), never its own id 0: container ids
//! `0..count` map one to one onto xfn's ids `1..=count` (65535 of a
//! privileged range, 65536 subordinate ones), so `User: 65532` is container
//! uid 65532 under a host uid that is not xfn's, and an id past them is
//! refused. Without spare ids (the unprivileged sidecar without
//! /etc/subuid) xfn has one id: the run's namespace then maps the *image's*
//! uid and gid onto it rather than 0, so a `nonroot` image (distroless
//! `65532:65532`, `1000`) runs as the user it names instead of failing with
//! "cannot setresgid".
//!
//! What a function on xfn's one id sees: `id` prints the image's uid and gid; every
//! file of its image (extracted by xfn, so owned by xfn's uid) is owned by
//! that uid and gid, as are `/tmp` and the rootfs's writable upper; root
//! (uid 0) and every other id are unmapped (they show as 65534, and
//! `setuid(0)` fails with `EINVAL`); it has no capabilities (a non-root
//! uid loses them at `execve`); supplementary groups are dropped, as the
//! one id cannot carry them (the function can then reach less, never
//! more). Its host uid is still xfn's: the mapping changes the name of the
//! one id, not who it is outside.
//!
//! An id of 4294967295 (`(uid_t)-1`) is refused, never passed on:
//! `setresuid(-1, …)` means "leave unchanged", so the function would keep
//! the runtime's root.
use std::path::Path;

use super::userns::FunctionIds;

/// Errors of user resolution.
#[derive(Debug, thiserror::Error)]
pub enum UserError {
    /// The user is not in the image's /etc/passwd.
    #[error("image user {user:?} is not in the image's /etc/passwd")]
    UnknownUser {
        /// The name asked for.
        user: String,
    },
    /// The group is not in the image's /etc/group.
    #[error("image group {group:?} is not in the image's /etc/group")]
    UnknownGroup {
        /// The name asked for.
        group: String,
    },
    /// The User field is malformed.
    #[error("image user {0:?} is malformed; expected user, uid, user:group or uid:gid")]
    Malformed(String),
    /// An id is `(uid_t)-1`, which the kernel reads as "unchanged".
    #[error("image user {user:?}: {id} is not a user or group id ((uid_t)-1 means \"leave unchanged\" to the kernel, so the function would keep root)")]
    InvalidId {
        /// The User field.
        user: String,
        /// The id.
        id: u32,
    },
    /// An id is outside the range xfn's namespace maps.
    #[error("image user {user:?}: id {id} is outside the {mapped} ids xfn maps (0-{}); rebuild the image with an id below {mapped}", mapped - 1)]
    Unmappable {
        /// The User field.
        user: String,
        /// The id.
        id: u32,
        /// How many ids xfn maps.
        mapped: u32,
    },
}

/// The ids a container process runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedUser {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Supplementary groups (from /etc/group membership when named by name).
    pub additional_gids: Vec<u32>,
}

/// Resolves `spec` (the image config's `User`) against the rootfs at `rootfs`.
/// Empty means root. A numeric uid that is not in /etc/passwd is allowed
/// (with gid 0 unless given), as Docker does; a name must exist.
pub fn resolve(spec: &str, rootfs: &Path) -> Result<ResolvedUser, UserError> {
    let spec = spec.trim();
    if spec.is_empty() {
        return Ok(ResolvedUser {
            uid: 0,
            gid: 0,
            additional_gids: Vec::new(),
        });
    }
    let (user, group) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    if user.is_empty() || group.is_some_and(|g| g.is_empty() || g.contains(':')) {
        return Err(UserError::Malformed(spec.to_string()));
    }
    let passwd = read_image_file(rootfs, "etc/passwd");
    let groups = read_image_file(rootfs, "etc/group");
    let entry = parse_passwd(&passwd)
        .into_iter()
        .find(|e| match user.parse::<u32>() {
            Ok(uid) => e.uid == uid,
            Err(_) => e.name == user,
        });
    let (uid, mut gid, name) = match (entry, user.parse::<u32>()) {
        (Some(e), _) => (e.uid, e.gid, Some(e.name)),
        (None, Ok(uid)) => (uid, 0, None),
        (None, Err(_)) => {
            return Err(UserError::UnknownUser {
                user: user.to_string(),
            })
        }
    };
    let group_entries = parse_group(&groups);
    if let Some(group) = group {
        gid = match group.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => group_entries
                .iter()
                .find(|g| g.name == group)
                .map(|g| g.gid)
                .ok_or_else(|| UserError::UnknownGroup {
                    group: group.to_string(),
                })?,
        };
    }
    let mut additional_gids = Vec::new();
    if let (Some(name), None) = (name, group) {
        for g in &group_entries {
            if g.gid != gid && g.members.contains(&name) {
                additional_gids.push(g.gid);
            }
        }
    }
    for id in [uid, gid]
        .into_iter()
        .chain(additional_gids.iter().copied())
    {
        if id == u32::MAX {
            return Err(UserError::InvalidId {
                user: spec.to_string(),
                id,
            });
        }
    }
    Ok(ResolvedUser {
        uid,
        gid,
        additional_gids,
    })
}

/// A resolved user as the run's namespace sees it: the ids the process
/// takes and the uid and gid maps that make them exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappedUser {
    /// The ids the function runs as (supplementary groups dropped where
    /// they cannot be mapped).
    pub user: ResolvedUser,
    /// The container uid that the run's first id (`host_base`) is.
    pub uid_base: u32,
    /// The container gid that the run's first id is.
    pub gid_base: u32,
    /// The id of xfn's namespace the maps start at: 0 (xfn's own) or 1
    /// (the first of the functions' ids).
    pub host_base: u32,
    /// How many ids each map maps.
    pub size: u32,
}

/// Maps `resolved` into a run's namespace over the functions' ids of xfn's
/// namespace (`userns::FunctionIds`: xfn's own id, or spare ids from 1),
/// as the module header says. `spec` is the User field, for errors.
pub fn map(spec: &str, resolved: ResolvedUser, ids: FunctionIds) -> Result<MappedUser, UserError> {
    let count = match ids {
        FunctionIds::Own => {
            return Ok(MappedUser {
                uid_base: resolved.uid,
                gid_base: resolved.gid,
                host_base: 0,
                size: 1,
                user: ResolvedUser {
                    additional_gids: Vec::new(),
                    ..resolved
                },
            })
        }
        FunctionIds::Spare { count } => count,
    };
    let ids = [resolved.uid, resolved.gid];
    if let Some(&id) = ids
        .iter()
        .chain(&resolved.additional_gids)
        .find(|&&id| id >= count)
    {
        return Err(UserError::Unmappable {
            user: spec.trim().to_string(),
            id,
            mapped: count,
        });
    }
    Ok(MappedUser {
        uid_base: 0,
        gid_base: 0,
        host_base: 1,
        size: count,
        user: resolved,
    })
}

/// Reads a file of the image without following a symlink out of it: an
/// image's /etc/passwd that is a symlink (possibly to the host's) counts as
/// absent.
fn read_image_file(rootfs: &Path, relative: &str) -> String {
    let path = rootfs.join(relative);
    match std::fs::symlink_metadata(&path) {
        Ok(meta) if meta.is_file() => std::fs::read_to_string(&path).unwrap_or_default(),
        _ => String::new(),
    }
}

struct PasswdEntry {
    name: String,
    uid: u32,
    gid: u32,
}

fn parse_passwd(text: &str) -> Vec<PasswdEntry> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            if fields.len() < 4 || line.starts_with('#') {
                return None;
            }
            Some(PasswdEntry {
                name: fields[0].to_string(),
                uid: fields[2].parse().ok()?,
                gid: fields[3].parse().ok()?,
            })
        })
        .collect()
}

struct GroupEntry {
    name: String,
    gid: u32,
    members: Vec<String>,
}

fn parse_group(text: &str) -> Vec<GroupEntry> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            if fields.len() < 3 || line.starts_with('#') {
                return None;
            }
            Some(GroupEntry {
                name: fields[0].to_string(),
                gid: fields[2].parse().ok()?,
                members: fields
                    .get(3)
                    .map(|m| {
                        m.split(',')
                            .filter(|s| !s.is_empty())
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rootfs() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("etc")).unwrap();
        std::fs::write(
            dir.path().join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\n# comment\nfn:x:1000:1001::/home/fn:/bin/sh\nbroken\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("etc/group"),
            "root:x:0:\nfns:x:1001:\nextra:x:2000:fn,other\nwheel:x:10:\n",
        )
        .unwrap();
        dir
    }

    fn ids(spec: &str) -> (u32, u32, Vec<u32>) {
        let r = resolve(spec, rootfs().path()).unwrap();
        (r.uid, r.gid, r.additional_gids)
    }

    #[test]
    fn forms() {
        assert_eq!(ids(""), (0, 0, vec![]));
        assert_eq!(ids("root"), (0, 0, vec![]));
        assert_eq!(ids("fn"), (1000, 1001, vec![2000]));
        assert_eq!(ids("1000"), (1000, 1001, vec![2000]));
        assert_eq!(ids("4242"), (4242, 0, vec![]));
        assert_eq!(ids("fn:wheel"), (1000, 10, vec![]));
        assert_eq!(ids("fn:77"), (1000, 77, vec![]));
        assert_eq!(ids("4242:4343"), (4242, 4343, vec![]));
        assert_eq!(ids("4242:fns"), (4242, 1001, vec![]));
    }

    #[test]
    fn unknown_names_are_errors() {
        let dir = rootfs();
        assert!(matches!(
            resolve("nobody", dir.path()),
            Err(UserError::UnknownUser { .. })
        ));
        assert!(matches!(
            resolve("fn:nogroup", dir.path()),
            Err(UserError::UnknownGroup { .. })
        ));
        for bad in [":1", "1:", "1:2:3"] {
            assert!(
                matches!(resolve(bad, dir.path()), Err(UserError::Malformed(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn an_id_of_minus_one_is_refused_not_read_as_unchanged() {
        let dir = rootfs();
        for spec in [
            "4294967295",
            "4294967295:0",
            "0:4294967295",
            "fn:4294967295",
        ] {
            assert!(
                matches!(
                    resolve(spec, dir.path()),
                    Err(UserError::InvalidId { id: u32::MAX, .. })
                ),
                "{spec}"
            );
        }
    }

    #[test]
    fn xfns_one_id_becomes_the_image_user_and_its_groups_are_dropped() {
        let fn_user = resolve("fn", rootfs().path()).unwrap();
        let mapped = map("fn", fn_user, FunctionIds::Own).unwrap();
        assert_eq!(
            (
                mapped.uid_base,
                mapped.gid_base,
                mapped.host_base,
                mapped.size
            ),
            (1000, 1001, 0, 1)
        );
        assert_eq!(
            (
                mapped.user.uid,
                mapped.user.gid,
                mapped.user.additional_gids
            ),
            (1000, 1001, vec![])
        );
        let root = map("", resolve("", rootfs().path()).unwrap(), FunctionIds::Own).unwrap();
        assert_eq!((root.uid_base, root.gid_base, root.size), (0, 0, 1));
    }

    #[test]
    fn spare_ids_map_image_users_one_to_one_past_xfns_own_and_refuse_ids_past_them() {
        let spare = FunctionIds::Spare { count: 65535 };
        let fn_user = resolve("fn", rootfs().path()).unwrap();
        let mapped = map("fn", fn_user.clone(), spare).unwrap();
        assert_eq!(
            (
                mapped.uid_base,
                mapped.gid_base,
                mapped.host_base,
                mapped.size
            ),
            (0, 0, 1, 65535)
        );
        assert_eq!(mapped.user, fn_user);
        for spec in ["65535", "0:70000", "fn:65535"] {
            let resolved = resolve(spec, rootfs().path()).unwrap();
            assert!(
                matches!(
                    map(spec, resolved, spare),
                    Err(UserError::Unmappable { mapped: 65535, .. })
                ),
                "{spec}"
            );
        }
    }

    #[test]
    fn symlinked_passwd_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("etc")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("etc/passwd")).unwrap();
        assert!(matches!(
            resolve("root", dir.path()),
            Err(UserError::UnknownUser { .. })
        ));
    }
}
