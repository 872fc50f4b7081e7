//! Resolving an image config's `User` (`name`, `uid`, `name:group`,
//! `uid:gid`, …) against the image's own /etc/passwd and /etc/group.
use std::path::Path;

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
    Ok(ResolvedUser {
        uid,
        gid,
        additional_gids,
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
