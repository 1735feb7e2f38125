//! Writes the generated CRDs to `crds/` (run by `make crds`).

use std::path::Path;

fn main() -> std::io::Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crds");
    std::fs::create_dir_all(&dir)?;
    for (file, crd) in netwave_api::crds() {
        let path = dir.join(file);
        std::fs::write(&path, netwave_api::crd_yaml(&crd))?;
        println!("wrote {}", path.display());
    }
    let path = dir.join(netwave_api::CRDS_KUSTOMIZATION);
    std::fs::write(&path, netwave_api::crds_kustomization())?;
    println!("wrote {}", path.display());
    Ok(())
}
