//! Rough throughput check: `cargo run --release -p sandbox-image --example unpack_bench`.
use std::os::fd::AsFd;
use std::time::Instant;

use sandbox_image::unpack::{apply_layer, UnpackBudget};

fn main() {
    let mut b = tar::Builder::new(Vec::new());
    let data = vec![b'x'; 1024];
    for d in 0..100 {
        for f in 0..1000 {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_mtime(1);
            b.append_data(&mut h, format!("usr/share/d{d}/f{f}"), &data[..])
                .unwrap();
        }
    }
    let small = b.into_inner().unwrap();
    let mut b = tar::Builder::new(Vec::new());
    let big: Vec<u8> = (0..(1u32 << 30)).map(|i| (i % 251) as u8).collect();
    let mut h = tar::Header::new_gnu();
    h.set_size(big.len() as u64);
    h.set_mode(0o644);
    b.append_data(&mut h, "big", &big[..]).unwrap();
    drop(big);
    let large = b.into_inner().unwrap();

    for (name, layer) in [("100k x 1 KiB files", &small), ("one 1 GiB file", &large)] {
        let tmp =
            tempfile::tempdir_in(std::env::var("BENCH_DIR").unwrap_or("/tmp".into())).unwrap();
        let root = std::fs::File::open(tmp.path()).unwrap();
        let t = Instant::now();
        let stats = apply_layer(root.as_fd(), &layer[..], &mut UnpackBudget::default()).unwrap();
        let el = t.elapsed();
        println!(
            "{name}: {} entries, {} MiB in {:.2?} ({:.0} MiB/s, {:.0} entries/s)",
            stats.entries,
            stats.bytes >> 20,
            el,
            stats.bytes as f64 / (1 << 20) as f64 / el.as_secs_f64(),
            stats.entries as f64 / el.as_secs_f64()
        );
    }
}
