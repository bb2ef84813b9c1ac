//! The statistics every experiment reports: medians of repeated runs, percentiles of
//! latencies. One definition each, so that two tables never disagree on what a median is.

/// The median of `values`: the middle one, or the mean of the two middle ones for an even
/// count; 0 for none. NaN sorts last (`total_cmp`), so it cannot hide a real value.
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => values[n / 2],
        _ => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// The `q` quantile (0 to 1) of `values` by nearest rank: the smallest value that at least
/// a share `q` of the values do not exceed (`q` = 0.99 of 1,000 values: the 990th
/// smallest). Sorts `values`; 0 for none.
pub fn percentile<T: Ord + Copy + Default>(values: &mut [T], q: f64) -> T {
    values.sort_unstable();
    let n = values.len();
    if n == 0 {
        return T::default();
    }
    let rank = (q.clamp(0.0, 1.0) * n as f64).ceil() as usize;
    values[rank.clamp(1, n) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_of_odd_even_and_empty_lists() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(vec![]), 0.0);
        assert_eq!(median(vec![f64::NAN, 1.0, 2.0]), 2.0, "NaN sorts last");
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let mut v: Vec<u32> = (1..=1000).rev().collect();
        assert_eq!(percentile(&mut v, 0.5), 500);
        assert_eq!(percentile(&mut v, 0.99), 990);
        assert_eq!(percentile(&mut v, 0.999), 999);
        assert_eq!(percentile(&mut v, 1.0), 1000);
        assert_eq!(percentile(&mut v, 0.0), 1);
        assert_eq!(percentile(&mut [7u64], 0.99), 7);
        assert_eq!(percentile::<u64>(&mut [], 0.5), 0);
    }
}
