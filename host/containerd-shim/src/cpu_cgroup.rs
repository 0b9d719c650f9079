//! CPU limits from the runtime spec, by moving the shim process into the
//! container's cgroup.
//!
//! A component runs as threads of the shim, not as a process of its own,
//! so the kernel can only hold it to a cgroup's CPU limits if the shim
//! itself is in that cgroup. At start the shim makes the cgroup
//! `linux.cgroupsPath` names (in the `cpu` controller, through
//! cgroups-rs, for cgroup v1 and v2 alike), sets `linux.resources.cpu`'s
//! shares, quota and period on it, and moves its whole process in; at
//! delete it moves back to where it was and removes the cgroup.
//!
//! A container without a CPU limit stays where the shim is (see [`join`]
//! for why).
//!
//! One shim runs every container of a Kubernetes Pod, and a process is in
//! one cgroup at a time, so under Kubernetes only the Pod's sandbox joins
//! its cgroup: that one sits in the Pod's cgroup, which the kubelet limits
//! to the sum of its containers' limits. The Pod as a whole is held to
//! its CPU limit; its containers share it, not each held to its own.
//! Outside Kubernetes every container has a shim of its own and is held
//! to its own limits exactly.

use cgroups_rs::cgroup::get_cgroups_relative_paths_by_pid;
use cgroups_rs::cpu::CpuController;
use cgroups_rs::{Cgroup, CgroupPid, hierarchies};
use oci_spec::runtime::Spec;

/// The controller whose limits the shim takes on.
const CPU: &str = "cpu";
/// The kernel's default CPU weight (`cpu.shares`): a container asking for
/// it asks for no more and no less than any process gets.
const DEFAULT_SHARES: u64 = 1024;

/// The cgroup the shim joined, and the one it came from.
#[derive(Debug)]
pub struct JoinedCgroup {
    cgroup: Cgroup,
    path: String,
    came_from: String,
}

/// Moves the shim into the cgroup `spec` names, with its CPU limits, when
/// there is something to hold it to: a CPU limit of the container's own,
/// or (`pod_cgroup`, a Kubernetes sandbox) the Pod's, set on the parent
/// folder by the kubelet. Otherwise it stays where it is: moving a
/// process that already runs threads into a cgroup costs a container's
/// start about 20 ms on cgroup v1 (the kernel waits for an RCU grace
/// period), measured with `cargo bench --bench containerd`.
///
/// None when the spec names no cgroup or nothing needs one. A failure is
/// an error when the spec asks for a CPU limit, which would otherwise go
/// unenforced; without one it is logged, and the container runs where the
/// shim is.
pub fn join(spec: &Spec, id: &str, pod_cgroup: bool) -> Result<Option<JoinedCgroup>, String> {
    let Some(linux) = spec.linux() else { return Ok(None) };
    let Some(path) = linux.cgroups_path().as_ref().map(|p| p.to_string_lossy().into_owned()) else {
        return Ok(None);
    };
    if path.is_empty() {
        return Ok(None);
    }
    let cpu = linux.resources().as_ref().and_then(|r| r.cpu().clone());
    let limited = cpu.as_ref().is_some_and(|c| {
        c.shares().is_some_and(|s| s != DEFAULT_SHARES) || c.quota().is_some_and(|q| q > 0)
    });
    if !limited && !pod_cgroup {
        return Ok(None);
    }
    match join_path(&cgroup_fs_path(&path), cpu.as_ref()) {
        Ok(joined) => {
            log::info!("container {id}: the shim is in cgroup {path}");
            Ok(Some(joined))
        }
        Err(e) if limited => Err(format!(
            "container {id}: its CPU limit (linux.resources.cpu) needs the shim in cgroup \
             {path}, and that failed: {e}"
        )),
        Err(e) => {
            log::warn!("container {id}: not moving the shim into cgroup {path}: {e}");
            Ok(None)
        }
    }
}

fn join_path(
    path: &str,
    cpu: Option<&oci_spec::runtime::LinuxCpu>,
) -> Result<JoinedCgroup, String> {
    let pid = CgroupPid::from(u64::from(std::process::id()));
    let came_from = get_cgroups_relative_paths_by_pid(std::process::id())
        .map_err(|e| format!("reading the shim's cgroup: {e}"))?
        .get(CPU)
        .cloned()
        .unwrap_or_default();
    let cgroup = Cgroup::new_with_specified_controllers(
        hierarchies::auto(),
        path.trim_start_matches('/'),
        Some(vec![CPU.to_owned()]),
    )
    .map_err(|e| format!("making it: {e}"))?;
    if let Some(cpu) = cpu {
        let controller: &CpuController =
            cgroup.controller_of().ok_or("it has no cpu controller")?;
        if let Some(shares) = cpu.shares() {
            controller.set_shares(shares).map_err(|e| format!("setting cpu shares: {e}"))?;
        }
        let quota = cpu.quota().filter(|&q| q > 0);
        if quota.is_some() || cpu.period().is_some() {
            controller
                .set_cfs_quota_and_period(quota, cpu.period())
                .map_err(|e| format!("setting the CPU quota: {e}"))?;
        }
    }
    cgroup.add_task_by_tgid(pid).map_err(|e| format!("moving the shim into it: {e}"))?;
    Ok(JoinedCgroup { cgroup, path: path.to_owned(), came_from })
}

impl JoinedCgroup {
    /// Moves the shim back where it came from and removes the cgroup.
    pub fn leave(self) {
        let pid = CgroupPid::from(u64::from(std::process::id()));
        let back = Cgroup::load_with_specified_controllers(
            hierarchies::auto(),
            self.came_from.trim_start_matches('/'),
            vec![CPU.to_owned()],
        );
        if let Err(e) = back.add_task_by_tgid(pid) {
            log::warn!("moving the shim back to cgroup {}: {e}", self.came_from);
            return;
        }
        if let Err(e) = self.cgroup.delete() {
            log::warn!("removing cgroup {}: {e}", self.path);
        }
    }
}

/// A systemd-style path (`slice:prefix:name`, what containerd passes with
/// `SystemdCgroup = true`) as the folder systemd gives it:
/// `kubepods-burstable.slice:cri-containerd:ID` is
/// `kubepods.slice/kubepods-burstable.slice/cri-containerd-ID.scope`. A
/// plain path is its own folder.
fn cgroup_fs_path(path: &str) -> String {
    let mut parts = path.splitn(3, ':');
    let (Some(slice), Some(prefix), Some(name)) = (parts.next(), parts.next(), parts.next()) else {
        return path.to_owned();
    };
    let mut folder = String::new();
    let stem = slice.strip_suffix(".slice").unwrap_or(slice);
    if stem != "-" && !stem.is_empty() {
        let mut so_far = String::new();
        for piece in stem.split('-') {
            if !so_far.is_empty() {
                so_far.push('-');
            }
            so_far.push_str(piece);
            folder.push_str(&so_far);
            folder.push_str(".slice/");
        }
    }
    folder.push_str(&format!("{prefix}-{name}.scope"));
    folder
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn systemd_paths_become_the_folders_systemd_makes() {
        assert_eq!(
            cgroup_fs_path("kubepods-burstable-pod1234.slice:cri-containerd:abc"),
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234.slice/\
             cri-containerd-abc.scope"
        );
        assert_eq!(cgroup_fs_path("system.slice:pier:x"), "system.slice/pier-x.scope");
        assert_eq!(cgroup_fs_path("-.slice:pier:x"), "pier-x.scope");
        assert_eq!(cgroup_fs_path("/default/web-1"), "/default/web-1");
    }
}
