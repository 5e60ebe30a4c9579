//! The one decider of a module's backend on a device, and its refusals.
//!
//! A module with a `backend` axis runs, on a GPU of compute capability `cc`, the first of its
//! backends (in the order variants.json declares) whose arch limit runs there. `jit` and `warm`
//! apply that rule here; `describe` writes its outcome out as data ([`table`]): for every range
//! of compute capabilities, the backends that run there in order of preference, and every
//! refusal message as a template. The Python loader reads that table (it ships as
//! `_data/matrix.json`) and fills the templates; it holds no rule of its own, and a precompiled
//! instance's first call starts no process.
//!
//! Templates name their holes `{cc}`, `{value}` and `{supports}`; everything else (the module,
//! the axis, each backend's arch limit, what a device range runs) is written in by [`table`].

use crate::arch::{self, Capability};
use crate::matrix::Module;
use crate::records::{BackendRow, BackendTable, DeviceRow};

/// Every compute capability `Capability::parse` accepts, in order (asked of the parser, so that
/// the range is stated there only).
pub fn capabilities() -> impl Iterator<Item = Capability> {
    (0..=100)
        .flat_map(|major| (0..=10).map(move |minor| format!("{major}.{minor}")))
        .filter_map(|text| Capability::parse(&text, "").ok())
}

/// The values (indices into the backend axis) that run on a GPU of `cc`, in order of
/// preference: the first is the one the device takes.
pub fn running(m: &Module, cc: Capability) -> Vec<usize> {
    let Some((bi, axis)) = m.backend_axis() else {
        return Vec::new();
    };
    (0..axis.values.len())
        .filter(|&vi| {
            let mut choice = vec![0; m.axes.len()];
            choice[bi] = vi;
            arch::limit_runs_on_device(m.arch_limit(&choice).as_deref(), cc)
        })
        .collect()
}

/// `template` with each `{name}` replaced by its value (the loader's `_matrix.fill` does the same).
pub fn fill(template: &str, holes: &[(&str, &str)]) -> String {
    holes
        .iter()
        .fold(template.to_string(), |text, (name, value)| {
            text.replace(&format!("{{{name}}}"), value)
        })
}

/// The table `describe` writes for a module with a backend axis (None without one).
pub fn table(m: &Module) -> Option<BackendTable> {
    let (bi, axis) = m.backend_axis()?;
    let name = &axis.name;
    let module = &m.name;
    let limits: Vec<Option<Vec<arch::Arch>>> = (0..axis.values.len())
        .map(|vi| {
            let mut choice = vec![0; m.axes.len()];
            choice[bi] = vi;
            m.arch_limit(&choice)
        })
        .collect();
    let each = |vi: usize| match &limits[vi] {
        None => axis.values[vi].to_string(),
        Some(l) => format!("{} ({} only)", axis.values[vi], arch::spell(l)),
    };
    let all = (0..axis.values.len())
        .map(each)
        .collect::<Vec<_>>()
        .join(", ");
    let order = (0..axis.values.len())
        .map(|vi| BackendRow {
            name: axis.values[vi].to_string(),
            arch_limit: limits[vi].as_deref().map(spelled),
            runs_on: limits[vi].as_deref().map(arch::runs_on_all),
            refused: limits[vi].as_deref().map(|l| {
                format!(
                    "{name}='{}' is built only for {}, which does not run on a GPU of compute \
                     capability {{cc}}; {{supports}}",
                    axis.values[vi],
                    arch::spell(l),
                )
            }),
        })
        .collect();
    let mut by_device: Vec<DeviceRow> = Vec::new();
    for cc in capabilities() {
        let runs: Vec<String> = running(m, cc)
            .into_iter()
            .map(|vi| axis.values[vi].to_string())
            .collect();
        match by_device.last_mut() {
            Some(last) if last.backends == runs => last.max = [cc.major, cc.minor],
            _ => by_device.push(DeviceRow {
                min: [cc.major, cc.minor],
                max: [cc.major, cc.minor],
                supports: if runs.is_empty() {
                    format!("no backend of {module} runs there")
                } else {
                    let quoted: Vec<String> = runs.iter().map(|r| format!("'{r}'")).collect();
                    format!(
                        "on this device {module} supports {name} {}",
                        quoted.join(", ")
                    )
                },
                backends: runs,
            }),
        }
    }
    Some(BackendTable {
        axis: name.clone(),
        order,
        by_device,
        unknown: format!("{name}='{{value}}' is not a backend of {module}; it has {all}"),
        none_runs: format!(
            "no backend of {module} runs on a GPU of compute capability {{cc}}: {all}"
        ),
        hint: format!("Leave {name} unset to take the first one the device runs."),
    })
}

fn spelled(archs: &[arch::Arch]) -> Vec<String> {
    archs.iter().map(ToString::to_string).collect()
}

/// The refusal for `value` of `m`'s backend axis on a GPU of `cc` (it does not run there).
pub fn refused(m: &Module, table: &BackendTable, value: &str, cc: Capability) -> String {
    let device = table.device(cc);
    let template = table
        .order
        .iter()
        .find(|b| b.name == value)
        .and_then(|b| b.refused.as_deref())
        .expect("a value of the axis, with an arch limit");
    format!(
        "{}: {}",
        m.name,
        fill(
            template,
            &[
                ("cc", &cc.to_string()),
                ("supports", device.map_or("", |d| d.supports.as_str())),
            ],
        )
    )
}

/// The refusal when no backend of `m` runs on a GPU of `cc`.
pub fn none_runs(m: &Module, table: &BackendTable, cc: Capability) -> String {
    format!(
        "{}: {}",
        m.name,
        fill(&table.none_runs, &[("cc", &cc.to_string())])
    )
}
