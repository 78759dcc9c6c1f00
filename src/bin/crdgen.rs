//! Print the Foo CustomResourceDefinition as YAML: `cargo run --bin crdgen`.

use kube::CustomResourceExt;
use sample_controller::Foo;

fn main() {
    match serde_saphyr::to_string(&Foo::crd()) {
        Ok(yaml) => print!("{yaml}"),
        Err(e) => {
            eprintln!("crdgen: cannot serialize the Foo CRD: {e}");
            std::process::exit(1);
        }
    }
}
