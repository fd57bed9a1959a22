//! Where the captured cases go, and writing them.

use std::path::{Path, PathBuf};

use super::{CaptureError, CapturedCase};

/// Where each case goes: `None` for standard output.
pub type Placement = (CapturedCase, Option<PathBuf>);

/// Whether `path` names a folder: it ends with `/` (created when missing) or
/// is one already.
pub(super) fn names_a_folder(path: &Path) -> bool {
    path.as_os_str().as_encoded_bytes().ends_with(b"/") || path.is_dir()
}

/// Pick the cases to write and where (see `capture --help`), checking every
/// target before any is written:
///
/// - `plugin`: only that plugin's cases (an error names the plugins there
///   are);
/// - `output` ending with `/`, or an existing folder: one
///   `<plugin>-<scenario>.json` per case in it (created when missing);
/// - one case: otherwise `output` is its file; without `output`, standard
///   output;
/// - several: anything but a folder is refused with the options that fix
///   it.
///
/// A target that exists already (a symbolic link included) is refused
/// unless `force`; a folder never is replaced.
pub fn place(
    cases: Vec<CapturedCase>,
    output: Option<&Path>,
    plugin: Option<&str>,
    force: bool,
) -> Result<Vec<Placement>, CaptureError> {
    let names: Vec<String> = cases
        .iter()
        .map(|c| format!("{} ({})", c.plugin, c.scenario))
        .collect();
    let cases = match plugin {
        None => cases,
        Some(wanted) => {
            let picked: Vec<CapturedCase> =
                cases.into_iter().filter(|c| c.plugin == wanted).collect();
            if picked.is_empty() {
                return Err(CaptureError::Output(format!(
                    "no plugin {wanted:?} plans for this pod; its plan is made by {}: pass one of those names to --plugin",
                    names.join(", ")
                )));
            }
            picked
        }
    };
    // Several cases left after --plugin are all that plugin's: only a
    // folder holds them.
    let fix = if plugin.is_some() {
        "pass --output DIR/ (a folder) for one case file each"
    } else {
        "pass --output DIR/ (a folder) for one case file each, or --plugin NAME for one"
    };
    let placed: Vec<Placement> = match (cases.len(), output) {
        (1, None) => cases.into_iter().map(|c| (c, None)).collect(),
        (_, Some(dir)) if names_a_folder(dir) => cases
            .into_iter()
            .map(|c| {
                let file = dir.join(c.file_name());
                (c, Some(file))
            })
            .collect(),
        (1, Some(path)) => cases
            .into_iter()
            .map(|c| (c, Some(path.to_owned())))
            .collect(),
        (n, Some(path)) => {
            let what = if path.symlink_metadata().is_ok() {
                "is a file"
            } else {
                "does not exist and does not end with / (a new folder must)"
            };
            return Err(CaptureError::Output(format!(
                "this pod's plan is made by {n} plugin calls ({}) and a case file holds one, but {} {what}: {fix}",
                names.join(", "),
                path.display()
            )));
        }
        (n, None) => {
            return Err(CaptureError::Output(format!(
                "this pod's plan is made by {n} plugin calls ({}) and a case file holds one: {fix}",
                names.join(", ")
            )));
        }
    };
    for path in placed.iter().filter_map(|(_, p)| p.as_deref()) {
        match path.symlink_metadata() {
            Ok(meta) if meta.is_dir() => {
                return Err(CaptureError::Output(format!(
                    "{} is a folder: a case is written to a file",
                    path.display()
                )));
            }
            Ok(_) if !force => {
                return Err(CaptureError::Output(format!(
                    "{} exists already: pass --force to replace it (nothing was written)",
                    path.display()
                )));
            }
            _ => {}
        }
    }
    if let Some(dir) = output.filter(|o| names_a_folder(o)) {
        std::fs::create_dir_all(dir).map_err(|source| CaptureError::Write {
            path: dir.to_owned(),
            source,
        })?;
    }
    Ok(placed)
}

/// Write each placed case to its file: to a new temporary file in the same
/// folder, then renamed into place, so a symbolic link there is replaced,
/// never followed; without `force` the rename refuses a file that appeared
/// since [`place`] checked. The cases for standard output are returned, in
/// order.
pub fn write(placed: &[Placement], force: bool) -> Result<Vec<&CapturedCase>, CaptureError> {
    let mut stdout = Vec::new();
    for (case, path) in placed {
        let Some(path) = path else {
            stdout.push(case);
            continue;
        };
        let failed = |source: std::io::Error| CaptureError::Write {
            path: path.clone(),
            source,
        };
        let folder = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let mut temp = tempfile::Builder::new()
            .prefix(".capture-")
            .tempfile_in(folder)
            .map_err(failed)?;
        std::io::Write::write_all(&mut temp, case.text.as_bytes()).map_err(failed)?;
        if force {
            temp.persist(path).map_err(|e| failed(e.error))?;
        } else {
            temp.persist_noclobber(path).map_err(|e| failed(e.error))?;
        }
    }
    Ok(stdout)
}
