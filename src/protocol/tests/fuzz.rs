//! Random and mutated lines: the parser never panics and always makes
//! progress.

use super::*;

#[test]
fn fuzz_random_bytes_and_mutated_lines() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let valid = valid_lines();
    for _ in 0..20_000 {
        check_no_panic_and_progress(&random_bytes(&mut rng));
        let line = &valid[rng.below(valid.len())];
        check_no_panic_and_progress(&mutate(&mut rng, line));
    }
}
