//! One nvcc invocation: the command line for an instance, and running it.
//!
//! The command is complete and standalone: the error shown on failure, and each entry of
//! `compile_commands.json`, can be pasted into a shell to reproduce the compile alone.
//!
//! nvcc never outlives the build. It runs under a guard: the flashgen binary re-executed with
//! [`GUARD_ARG`], leader of its own process group, holding the read end of a pipe whose write
//! end only the build holds. However the build ends (exit, SIGINT, `kill -9`), the kernel closes
//! that pipe, and the guard kills its process group: nvcc and everything nvcc started (cicc,
//! ptxas, cudafe++, the host compiler), which inherit the group. A parent-death signal alone
//! would reach nvcc but not its children.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::arch::Arch;
use crate::toolchain::Toolchain;

/// Flags every instance gets: a self-contained shared object with only the C entry points
/// exported, and reproducible bytes (see DEVELOPERS.md).
const FIXED_FLAGS: &[&str] = &[
    "-shared",
    "-Xcompiler=-fPIC",
    "-cudart=static",
    "-Xlinker=--strip-all",
    "-Xlinker=--build-id=none",
];

pub const FATBIN_COMPRESSION: &str = "-Xfatbin=-compress-all";

/// The flags that shape the output, in order: they go into the cache key.
pub fn output_flags(user_flags: &[String], archs: &[Arch], compress: bool) -> Vec<String> {
    let mut flags: Vec<String> = FIXED_FLAGS.iter().map(|s| s.to_string()).collect();
    flags.extend(user_flags.iter().cloned());
    if compress && !flags.iter().any(|f| f == FATBIN_COMPRESSION) {
        flags.push(FATBIN_COMPRESSION.into());
    }
    flags.extend(archs.iter().flat_map(Arch::gencode));
    flags
}

#[derive(Debug, Clone)]
pub struct NvccCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
}

impl NvccCommand {
    /// `include_dirs` are searched in order; the generated header's folder comes first.
    pub fn new(
        tc: &Toolchain,
        flags: &[String],
        include_dirs: &[PathBuf],
        source: &Path,
        output: &Path,
    ) -> Self {
        let mut args: Vec<String> = Vec::new();
        if std::env::var_os("NVCC_CCBIN").is_some() {
            args.push(format!("-ccbin={}", tc.host_compiler_path.display()));
        }
        args.extend(flags.iter().cloned());
        args.extend(include_dirs.iter().map(|d| format!("-I{}", d.display())));
        args.extend(tc.lib_dirs.iter().map(|d| format!("-L{}", d.display())));
        args.push(source.display().to_string());
        args.push("-o".into());
        args.push(output.display().to_string());
        NvccCommand {
            program: tc.nvcc.clone(),
            args,
        }
    }

    /// The command as one shell line.
    pub fn shell_line(&self) -> String {
        std::iter::once(self.program.display().to_string())
            .chain(self.args.iter().cloned())
            .map(|a| shell_quote(&a))
            .collect::<Vec<_>>()
            .join(" ")
    }

    pub fn argv(&self) -> Vec<String> {
        std::iter::once(self.program.display().to_string())
            .chain(self.args.iter().cloned())
            .collect()
    }

    /// Runs nvcc under the guard, with `TMPDIR` set to `tmpdir` (a folder the build owns and
    /// removes); on failure returns its status text and output.
    pub fn run(&self, tmpdir: &Path) -> Result<Duration, (String, String)> {
        let start = Instant::now();
        let exe = std::env::current_exe().map_err(|e| {
            (
                format!("could not start: cannot locate flashgen: {e}"),
                String::new(),
            )
        })?;
        let child = Command::new(exe)
            .arg(GUARD_ARG)
            .arg(&self.program)
            .args(&self.args)
            .env("TMPDIR", tmpdir)
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let mut child = match child {
            Ok(c) => c,
            Err(e) => return Err((format!("could not start: {e}"), String::new())),
        };
        // The lifeline: held open until nvcc is done (wait_with_output would close it first).
        let lifeline = child.stdin.take();
        let out = child.wait_with_output();
        drop(lifeline);
        match out {
            Ok(out) if out.status.success() => Ok(start.elapsed()),
            Ok(out) => {
                let mut text = String::from_utf8_lossy(&out.stderr).into_owned();
                text.push_str(&String::from_utf8_lossy(&out.stdout));
                Err((out.status.to_string(), text))
            }
            Err(e) => Err((format!("could not wait for nvcc: {e}"), String::new())),
        }
    }
}

/// The hidden first argument that runs the flashgen binary as an nvcc guard (see the module
/// doc). A binary that builds through this library must call [`guard_main`] when it sees it.
pub const GUARD_ARG: &str = "__nvcc-guard";

/// The guard: runs `args` (nvcc and its arguments) in this process group, kills the whole group
/// when stdin reaches end of file (the build is gone), and exits as nvcc did.
pub fn guard_main(args: Vec<OsString>) -> ! {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    let Some((program, rest)) = args.split_first() else {
        eprintln!("flashgen {GUARD_ARG}: no program given");
        std::process::exit(2);
    };
    let mut child = match Command::new(program)
        .args(rest)
        .stdin(Stdio::null())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cannot start {}: {e}", Path::new(program).display());
            std::process::exit(127);
        }
    };
    std::thread::spawn(|| {
        let mut buf = [0u8; 64];
        let mut stdin = std::io::stdin();
        while matches!(stdin.read(&mut buf), Ok(n) if n > 0) {}
        // SAFETY: kill(2) with pid 0 signals this process group, which the guard leads.
        unsafe { libc::kill(0, libc::SIGKILL) };
    });
    match child.wait() {
        Ok(status) => match (status.code(), status.signal()) {
            (Some(code), _) => std::process::exit(code),
            (None, Some(sig)) => {
                // Die the same way, so the build reports nvcc's signal.
                // SAFETY: resetting a signal to its default action and raising it.
                unsafe {
                    libc::signal(sig, libc::SIG_DFL);
                    libc::raise(sig);
                }
                std::process::exit(128 + sig)
            }
            _ => std::process::exit(1),
        },
        Err(e) => {
            eprintln!("cannot wait for {}: {e}", Path::new(program).display());
            std::process::exit(1)
        }
    }
}

fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_=/.,:+@%".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}
