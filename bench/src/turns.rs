//! The order a repeat measures its subjects in, where they take turns one whole figure
//! each (an iperf3 run of several seconds): as listed on even repeats, reversed on odd ones
//! (A B, B A, A B, …). With a fixed order the same subject would always run first, right
//! after the setup or the previous figure's load, and on this shared machine load changes
//! over seconds: a bias that repeats do not average out.

/// `items` in the order repeat `repeat` (from 0) measures them.
pub fn in_turn<T>(items: &[T], repeat: usize) -> Vec<&T> {
    let mut v: Vec<&T> = items.iter().collect();
    if repeat % 2 == 1 {
        v.reverse();
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_other_repeat_measures_the_subjects_the_other_way_round() {
        let s = ["reference", "ebpf-cni", "veth"];
        assert_eq!(in_turn(&s, 0), [&"reference", &"ebpf-cni", &"veth"]);
        assert_eq!(in_turn(&s, 1), [&"veth", &"ebpf-cni", &"reference"]);
        assert_eq!(in_turn(&s, 2), in_turn(&s, 0));
        // Over two repeats each subject is measured first once.
        let firsts: Vec<_> = (0..2).map(|r| *in_turn(&s[..2], r)[0]).collect();
        assert_eq!(firsts, ["reference", "ebpf-cni"]);
    }
}
