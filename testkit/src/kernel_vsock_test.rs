//! The guest that runs Linux's own vsock test suite,
//! `tools/testing/vsock/vsock_test`, built from the Debian kernel source of
//! the guest kernel's exact version (the cases test that kernel's
//! behaviour, so the two must match).
//!
//! Two such guests on one vhost-user backend run it against each other:
//! one as `--mode=server`, the other as `--mode=client`, then the roles
//! swapped. `vsock_test`'s control channel is TCP, so the two QEMUs share
//! a private link of their own (`-netdev socket` over host loopback) and
//! the guests take the link-local addresses given on their kernel command
//! line; no other address is used.
//!
//! Everything comes from Debian packages, fetched with `apt-get download`
//! and unpacked into the cache (`cache_dir("kernel-vsock-test")`), never
//! installed. [`Kernel`] says which kernel: the host release's own, or the
//! newest Debian offers a Debian 12 machine (trixie-backports), reached
//! through a private apt state (`APT_CONFIG`: lists and sources under the
//! cache, the host's mirror and keyring) so the host's own sources are
//! never touched.
//!
//! The guest's `/init` runs one case per `vsock_test` process (`--pick`,
//! or `--skip` of every other case where the tool is older), each on its
//! own vsock port pair (`--peer-port`, where the tool has it: 6.1's uses
//! port 1234 for every case), so one failing case (the tool exits on the
//! first failure) neither hides the others nor leaves a port in a state
//! the next case trips on. It prints [`RUNNING`] once it is up, a
//! [`CASE_MARKER`] line per case and [`DONE`] at the end, then powers off. Its parameters come from the
//! kernel command line ([`GuestRole::kernel_args`]): words of the form
//! `name=value` that the kernel does not know reach `/init` as environment
//! variables.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::linux_guest::{
    Apt, DebianKernel, LinuxGuest, MODULES, base_initramfs, download, init_prologue,
    kernel_package, read, unpack,
};
use crate::tools::{self, GCC, LIBC6_DEV, XZ};
use crate::{Output, cache_dir, run};

/// The suite that offers a Debian 12 machine the newest Debian kernel.
pub const NEWEST_KERNEL_SUITE: &str = "trixie-backports";

/// The modules the guest loads after the vsock transport's
/// (`linux_guest::MODULES`), in load order: the network device the
/// control channel runs over.
pub const NET_MODULES: &[&str] = &["failover", "net_failover", "virtio_net"];

/// The line `/init` prints after each case: `vsock_test-case: <role>
/// <id> rc=<exit status>`, the tool's own output before it (less the
/// line it prints for each case it skips).
pub const CASE_MARKER: &str = "vsock_test-case: ";
/// The line `/init` prints once the guest is up, before the first case.
pub const RUNNING: &str = "vsock_test-guest: running";
/// The line `/init` prints once every case has run in both roles.
pub const DONE: &str = "vsock_test-guest: done";
/// The TCP port of the control channel on the server's side.
pub const CONTROL_PORT: u16 = 5000;
/// Case `id` uses vsock ports `PEER_PORT_BASE + 2 * id` and the next one
/// in the first direction, and the pair `2 * cases` above in the second:
/// a case never meets a socket an earlier one left behind.
pub const PEER_PORT_BASE: u32 = 20000;

/// Which Debian kernel the guest runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// The host release's own (`linux-image-amd64` in the host's apt
    /// sources: 6.1 on Debian 12).
    HostRelease,
    /// The newest Debian offers this machine: `linux-image-amd64` from
    /// [`NEWEST_KERNEL_SUITE`].
    Newest,
}

impl Kernel {
    /// A short name for reports and cache folders.
    pub fn name(self) -> &'static str {
        match self {
            Self::HostRelease => "host-release",
            Self::Newest => "newest",
        }
    }
}

/// A built guest for one kernel.
#[derive(Clone, Debug)]
pub struct KernelTestGuest {
    /// The kernel, and the initramfs (busybox, the modules, `/vsock_test`,
    /// `/init`), as `crate::linux_vm` boots them.
    pub guest: LinuxGuest,
    /// The Debian version of the kernel and its source (`7.3.4-1~bpo13+1`).
    pub debian_version: String,
    /// `vsock_test` itself, static: it also runs on the host, for
    /// `--list`.
    pub vsock_test: PathBuf,
}

impl KernelTestGuest {
    /// The cases this `vsock_test` has, by id: what its `--list` prints.
    pub fn cases(&self) -> Result<Vec<(u32, String)>, String> {
        let out = Command::new(&self.vsock_test)
            .arg("--list")
            .output()
            .map_err(|e| format!("running {} --list: {e}", self.vsock_test.display()))?;
        let cases = parse_case_list(&String::from_utf8_lossy(&out.stdout));
        if cases.is_empty() {
            return Err(format!(
                "{} --list named no case ({}): {}",
                self.vsock_test.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(cases)
    }
}

/// `ID<tab>Test name` lines (after a header) into `(id, name)`.
fn parse_case_list(text: &str) -> Vec<(u32, String)> {
    text.lines()
        .filter_map(|line| {
            let (id, name) = line.split_once('\t')?;
            Some((id.trim().parse().ok()?, name.trim().to_owned()))
        })
        .collect()
}

/// One guest's part in a run.
#[derive(Clone, Debug)]
pub struct GuestRole {
    /// This guest's link-local address (`fe80::a`).
    pub ip: &'static str,
    /// The other guest's.
    pub peer_ip: &'static str,
    /// The other guest's CID.
    pub peer_cid: u32,
    /// Whether this guest is the server first (then the client).
    pub server_first: bool,
    /// How many cases the tool has (ids `0..cases`): each case's ports
    /// follow from it ([`PEER_PORT_BASE`]).
    pub cases: u32,
    /// The ids to run, in order; empty runs them all. A rerun of a few
    /// cases boots fresh guests with only those.
    pub only: Vec<u32>,
}

impl GuestRole {
    /// The words to add to the guest's kernel command line.
    pub fn kernel_args(&self) -> String {
        let mut args = format!(
            "vt_ip={} vt_peer_ip={} vt_peer_cid={} vt_first={} vt_cases={} vt_control_port={} \
             vt_port_base={}",
            self.ip,
            self.peer_ip,
            self.peer_cid,
            if self.server_first { "server" } else { "client" },
            self.cases,
            CONTROL_PORT,
            PEER_PORT_BASE
        );
        if !self.only.is_empty() {
            let ids: Vec<String> = self.only.iter().map(u32::to_string).collect();
            args.push_str(&format!(" vt_only={}", ids.join(",")));
        }
        args
    }
}

/// Builds the guest for `kernel`: fetches the kernel, its source and
/// busybox (once), builds `vsock_test` (once per version), packs the
/// initramfs. Processes take turns on a lock file in the cache.
pub fn build(kernel: Kernel, output: Output) -> Result<KernelTestGuest, String> {
    let cache = cache_dir("kernel-vsock-test").join(kernel.name());
    fs::create_dir_all(&cache).map_err(|e| format!("creating {}: {e}", cache.display()))?;
    let lock_path = cache.join(".lock");
    let lock =
        File::create(&lock_path).map_err(|e| format!("creating {}: {e}", lock_path.display()))?;
    lock.lock().map_err(|e| format!("locking {}: {e}", lock_path.display()))?;

    let apt_config;
    let apt = match kernel {
        Kernel::HostRelease => Apt::Host,
        Kernel::Newest => {
            apt_config = private_apt(&cache.join("apt"), NEWEST_KERNEL_SUITE)?;
            Apt::Private(&apt_config)
        }
    };
    let package = kernel_package(apt)?;
    let debian_version = candidate_version(apt, &package)?;
    // Debian 13 splits the kernel into linux-binary- and linux-modules-;
    // linux-image- then only depends on them.
    let mut roots = vec![unpack(&package, &cache, apt)?];
    let release = package.strip_prefix("linux-image-").unwrap_or(&package).to_owned();
    for part in depends(apt, &package)? {
        if part == format!("linux-binary-{release}") || part == format!("linux-modules-{release}") {
            roots.push(unpack(&part, &cache, apt)?);
        }
    }
    let debian_kernel = DebianKernel::find(&package, &roots)?;
    let vsock_test = build_vsock_test(&cache, apt, &release, &debian_version, output)?;
    let busybox_root = unpack("busybox-static", &cache, Apt::Host)?;

    let names: Vec<&str> = MODULES.iter().chain(NET_MODULES).copied().collect();
    let modules = debian_kernel.modules(&names)?;
    let mut cpio = base_initramfs(&busybox_root, &modules)?;
    cpio.file("vsock_test", 0o755, &read(&vsock_test)?);
    let mut init = init_prologue(&modules, "The kernel vsock_test guest's init");
    init.push_str(INIT_BODY);
    cpio.file("init", 0o755, init.as_bytes());
    let initrd = cache.join("initrd.cpio");
    cpio.write(&initrd)?;
    Ok(KernelTestGuest {
        guest: LinuxGuest { kernel: debian_kernel.image, initrd, kernel_release: release },
        debian_version,
        vsock_test,
    })
}

/// What `/init` does after loading the modules: bring up the private
/// link, run every case (or those `vt_only` lists) in this guest's first
/// role and then in the other (on ports of its own, [`PEER_PORT_BASE`]),
/// power off. A client retries its control connection (the server of the
/// same case may not listen yet) only while the tool says it could not
/// connect, so a case is never run twice.
const INIT_BODY: &str = r#"ip link set lo up
waited=0
while [ ! -e /sys/class/net/eth0 ] && [ $waited -lt 100 ]; do usleep 100000; waited=$((waited + 1)); done
[ -e /sys/class/net/eth0 ] || echo "init: no eth0 (network devices: $(ls /sys/class/net))"
echo 0 > /proc/sys/net/ipv6/conf/eth0/accept_dad
ip link set eth0 up
ip -6 addr add "$vt_ip/64" dev eth0 || echo "init: no address $vt_ip on eth0"
help=$(/vsock_test --help 2>&1)
case "$help" in *--pick*) pick=yes ;; *) pick=no ;; esac
case "$help" in *--peer-port*) peer_port=yes ;; *) peer_port=no ;; esac
peer_port_arg() {
    [ $peer_port = yes ] && echo "--peer-port=$1"
}
select_case() {
    if [ $pick = yes ]; then echo "--pick=$1"; return; fi
    j=0
    while [ $j -lt "$vt_cases" ]; do
        [ $j -ne "$1" ] && printf -- '--skip=%s ' $j
        j=$((j + 1))
    done
}
case_ids() {
    if [ -n "$vt_only" ]; then echo "$vt_only" | tr , ' '; return; fi
    j=0
    while [ $j -lt "$vt_cases" ]; do
        printf '%s ' $j
        j=$((j + 1))
    done
}
run_role() {
    role=$1
    base=$2
    for i in $(case_ids); do
        port=$((base + 2 * i))
        tries=0
        while :; do
            if [ "$role" = server ]; then
                timeout 300 /vsock_test --mode=server --control-host=:: \
                    --control-port="$vt_control_port" --peer-cid="$vt_peer_cid" \
                    $(peer_port_arg $port) $(select_case $i) > /tmp/out 2>&1
            else
                timeout 300 /vsock_test --mode=client --control-host="$vt_peer_ip%eth0" \
                    --control-port="$vt_control_port" --peer-cid="$vt_peer_cid" \
                    $(peer_port_arg $port) $(select_case $i) > /tmp/out 2>&1
            fi
            rc=$?
            if [ "$role" = client ] && [ $tries -lt 3000 ] \
                && grep -q "Control socket initialization failed" /tmp/out; then
                tries=$((tries + 1))
                usleep 200000
                continue
            fi
            break
        done
        grep -v '\.\.\.skipped$' /tmp/out
        echo "vsock_test-case: $role $i rc=$rc"
    done
}
echo "vsock_test-guest: running"
second_base=$((vt_port_base + 2 * vt_cases))
if [ "$vt_first" = server ]; then
    run_role server "$vt_port_base"
    run_role client "$second_base"
else
    run_role client "$vt_port_base"
    run_role server "$second_base"
fi
echo "vsock_test-guest: done"
poweroff -f
"#;

/// A private apt state under `dir` whose only source is `suite` on the
/// host's own Debian mirror, signed by the host's Debian keyring: apt
/// commands given its config (`APT_CONFIG`) see that suite's packages and
/// leave the host's apt alone. Returns the config file; its lists are
/// fetched when missing or a day old, and refreshed when a download
/// fails.
fn private_apt(dir: &Path, suite: &str) -> Result<PathBuf, String> {
    let mirror = host_mirror()?;
    let lists = dir.join("lists");
    let archives = dir.join("cache/archives");
    for d in [lists.join("partial"), archives.join("partial"), dir.join("sources.list.d")] {
        fs::create_dir_all(&d).map_err(|e| format!("creating {}: {e}", d.display()))?;
    }
    let keyring = "/usr/share/keyrings/debian-archive-keyring.gpg";
    if !Path::new(keyring).is_file() {
        return Err(format!(
            "no {keyring}: reaching {suite} needs Debian's archive keyring (sudo apt-get install \
             debian-archive-keyring)"
        ));
    }
    let sources = dir.join("sources.list.d/suite.list");
    write(&sources, &format!("deb [signed-by={keyring}] {mirror} {suite} main\n"))?;
    let status = dir.join("status");
    write(&status, "")?;
    let config = dir.join("apt.conf");
    let text = format!(
        "Dir::State \"{d}\";\nDir::State::Lists \"{lists}\";\nDir::State::status \
         \"{status}\";\nDir::Cache \"{d}/cache\";\nDir::Etc::SourceList \"/dev/null\";\n\
         Dir::Etc::SourceParts \"{d}/sources.list.d\";\nDir::Etc::Preferences \"/dev/null\";\n\
         Dir::Etc::PreferencesParts \"/dev/null\";\nAcquire::Languages \"none\";\n\
         APT::Architecture \"amd64\";\nAPT::Architectures {{ \"amd64\"; }};\n",
        d = dir.display(),
        lists = lists.display(),
        status = status.display(),
    );
    write(&config, &text)?;
    // Backports keep only their newest kernel: lists a day old may name
    // packages the mirror has dropped.
    // (apt gives the lists the mirror's dates, so a marker of our own
    // says when they were fetched.)
    let updated = dir.join("lists-updated");
    let fresh = fs::metadata(&updated)
        .and_then(|m| m.modified())
        .is_ok_and(|t| t.elapsed().is_ok_and(|age| age < std::time::Duration::from_secs(86_400)));
    if !fresh {
        Apt::Private(&config).update()?;
        write(&updated, "")?;
    }
    Ok(config)
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))
}

/// The URI of the mirror the host's apt takes its own release from (the
/// `500 <uri> <codename>/main` line of `apt-cache policy`).
fn host_mirror() -> Result<String, String> {
    let release = fs::read_to_string("/etc/os-release").unwrap_or_default();
    let codename = release
        .lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|c| c.trim_matches('"').to_owned())
        .ok_or("/etc/os-release names no VERSION_CODENAME: the kernel test needs Debian")?;
    let out = Command::new("apt-cache")
        .arg("policy")
        .output()
        .map_err(|e| format!("running apt-cache policy: {e}"))?;
    let suite = format!("{codename}/main");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            (words.len() >= 3 && words[2] == suite && words[1].contains("://"))
                .then(|| words[1].to_owned())
        })
        .ok_or_else(|| {
            format!(
                "apt-cache policy shows no mirror for {suite}; the kernel test reaches Debian's \
                 other suites through the mirror the host uses for its own (apt-get update \
                 first)"
            )
        })
}

/// The version `apt` would take of `package`.
fn candidate_version(apt: Apt, package: &str) -> Result<String, String> {
    let out = apt
        .command("apt-cache")
        .args(["policy", package])
        .output()
        .map_err(|e| format!("running apt-cache policy {package}: {e}"))?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.trim().strip_prefix("Candidate:").map(|v| v.trim().to_owned()))
        .filter(|v| v != "(none)")
        .ok_or_else(|| format!("apt knows no version of {package}"))
}

/// The packages `package` depends on.
fn depends(apt: Apt, package: &str) -> Result<Vec<String>, String> {
    let out = apt
        .command("apt-cache")
        .args(["depends", package])
        .output()
        .map_err(|e| format!("running apt-cache depends {package}: {e}"))?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Depends:").map(|d| d.trim().to_owned()))
        .collect())
}

/// Builds `vsock_test` (static, so the initramfs needs no C library) from
/// `linux-source-<major.minor>` at `version`, the kernel's own, once.
fn build_vsock_test(
    cache: &Path,
    apt: Apt,
    release: &str,
    version: &str,
    output: Output,
) -> Result<PathBuf, String> {
    let series: Vec<&str> = release.split(['.', '-', '+']).take(2).collect();
    let source_package = format!("linux-source-{}", series.join("."));
    let dir = cache.join(format!("vsock_test-{version}"));
    let binary = dir.join("vsock_test");
    if binary.is_file() {
        return Ok(binary);
    }
    let deb = download(&format!("{source_package}={version}"), &cache.join("debs"), apt)?;
    let xz = tools::ensure(XZ)?;
    let gcc = tools::ensure(GCC)?;
    tools::ensure_deb(LIBC6_DEV)?;
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    // Only the tool's folder and the headers it includes come out of the
    // tarball (about 1 % of it).
    let top = &source_package;
    let script = format!(
        "dpkg-deb --fsys-tarfile \"$1\" | tar -xO ./usr/src/{top}.tar.xz | \"$2\" -dc | \
         tar -x -C \"$3\" --strip-components=1 {top}/tools/testing/vsock {top}/tools/include"
    );
    run(
        Command::new("sh").args(["-c", &script, "sh"]).arg(&deb).arg(&xz).arg(&dir),
        &format!("unpacking tools/testing/vsock from {}", deb.display()),
        Output::OnFailure,
    )?;
    let tool_dir = dir.join("tools/testing/vsock");
    let makefile = fs::read_to_string(tool_dir.join("Makefile"))
        .map_err(|e| format!("reading {}'s tools/testing/vsock/Makefile: {e}", source_package))?;
    let objects = vsock_test_objects(&makefile).ok_or_else(|| {
        format!("{source_package}'s tools/testing/vsock/Makefile names no vsock_test objects")
    })?;
    let sources: Vec<String> = objects.iter().map(|o| o.replace(".o", ".c")).collect();
    run(
        Command::new(gcc)
            .current_dir(&tool_dir)
            .args(["-static", "-O2", "-I.", "-I../../include", "-D_GNU_SOURCE"])
            .args(["-Wno-pointer-sign", "-fno-strict-overflow", "-fno-strict-aliasing"])
            .args(["-o", "vsock_test"])
            .args(&sources)
            .arg("-lpthread"),
        &format!("building vsock_test from {source_package} {version}"),
        output,
    )?;
    fs::rename(tool_dir.join("vsock_test"), &binary)
        .map_err(|e| format!("moving vsock_test to {}: {e}", binary.display()))?;
    // The source package is needed again only for another version, which
    // is another download anyway; it is the largest file in the cache.
    let _ = fs::remove_file(&deb);
    Ok(binary)
}

/// The objects the tool's Makefile links into `vsock_test` (its
/// `vsock_test: a.o b.o ...` rule).
fn vsock_test_objects(makefile: &str) -> Option<Vec<String>> {
    makefile.lines().find_map(|line| {
        let deps = line.strip_prefix("vsock_test:")?;
        let objects: Vec<String> =
            deps.split_whitespace().filter(|w| w.ends_with(".o")).map(str::to_owned).collect();
        (!objects.is_empty()).then_some(objects)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_makefile_rule_names_the_objects_and_not_the_libraries() {
        let makefile = "test: vsock_test vsock_diag_test\n\
                        vsock_test: vsock_test.o timeout.o control.o util.o\n\
                        vsock_test: LDLIBS = -lpthread\n";
        assert_eq!(
            vsock_test_objects(makefile).unwrap(),
            ["vsock_test.o", "timeout.o", "control.o", "util.o"]
        );
    }

    #[test]
    fn the_case_list_skips_its_header() {
        let list = "ID\tTest name\n0\tSOCK_STREAM connection reset\n12\tSOCK_STREAM bind only\n";
        assert_eq!(
            parse_case_list(list),
            [(0, "SOCK_STREAM connection reset".to_owned()), (12, "SOCK_STREAM bind only".into())]
        );
    }
}
