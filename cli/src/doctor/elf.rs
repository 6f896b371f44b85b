//! The Slurm release a plugin was built for: the value of its exported
//! `plugin_version`, the number Slurm itself compares with its own before
//! it loads a plugin (major and minor must match).

use object::{Object, ObjectSection, ObjectSymbol};

/// `Ok(None)`: an ELF shared object that exports no `plugin_version`.
pub fn plugin_version(bytes: &[u8]) -> Result<Option<u32>, String> {
    let file = object::File::parse(bytes).map_err(|e| format!("not an ELF shared object ({e})"))?;
    let Some(sym) = file.dynamic_symbols().find(|s| s.name() == Ok("plugin_version")) else {
        return Ok(None);
    };
    let addr = sym.address();
    for section in file.sections() {
        let start = section.address();
        if addr < start || addr + 4 > start + section.size() {
            continue;
        }
        let data = section.data().map_err(|e| format!("cannot read the section holding plugin_version: {e}"))?;
        let offset = (addr - start) as usize;
        let Some(b) = data.get(offset..offset + 4) else {
            return Err("plugin_version lies in a section without file contents".into());
        };
        let b: [u8; 4] = b.try_into().map_err(|_| "plugin_version is not 4 bytes".to_string())?;
        return Ok(Some(if file.is_little_endian() { u32::from_le_bytes(b) } else { u32::from_be_bytes(b) }));
    }
    Err(format!("plugin_version (address {addr:#x}) lies in no section"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_is_not_elf_is_said_so() {
        let e = plugin_version(b"#!/bin/sh\necho not a plugin\n").unwrap_err();
        assert!(e.starts_with("not an ELF shared object"), "{e}");
    }

    #[test]
    fn an_elf_file_without_the_symbol_is_none() {
        // This test's own executable is ELF and exports no plugin_version.
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(plugin_version(&me), Ok(None));
    }
}
