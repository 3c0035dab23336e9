//! The watermark valve (Flink's `StatusWatermarkValve`): a task's watermark
//! is the minimum over its input channels that are active, aligned and not
//! ended, and never goes backwards. A channel that turns idle stops holding
//! the minimum back; when every channel is idle the task is idle, after
//! emitting the largest watermark any channel reached. A channel that turns
//! active again behind the task's watermark counts again only once it
//! catches up. State only: the input processor emits what it returns.

use fluvia_network::WatermarkStatus;

#[derive(Debug, Clone, Copy)]
struct ChannelTime {
    watermark: i64,
    idle: bool,
    /// Whether it takes part in the minimum (caught up with the output).
    aligned: bool,
    finished: bool,
}

#[derive(Debug)]
pub struct StatusWatermarkValve {
    channels: Vec<ChannelTime>,
    last_output: i64,
    idle: bool,
}

impl StatusWatermarkValve {
    pub fn new(num_channels: usize) -> Self {
        StatusWatermarkValve {
            channels: vec![
                ChannelTime {
                    watermark: i64::MIN,
                    idle: false,
                    aligned: true,
                    finished: false,
                };
                num_channels
            ],
            last_output: i64::MIN,
            idle: false,
        }
    }

    /// The task's watermark so far (`i64::MIN` before the first).
    pub fn current(&self) -> i64 {
        self.last_output
    }

    /// A watermark arrived on `channel`: the task's new watermark, if it
    /// advanced.
    pub fn watermark(&mut self, channel: usize, watermark: i64) -> Option<i64> {
        let ch = &mut self.channels[channel];
        if ch.idle || ch.finished || watermark <= ch.watermark {
            return None;
        }
        ch.watermark = watermark;
        if !ch.aligned && watermark >= self.last_output {
            ch.aligned = true;
        }
        self.advance()
    }

    /// `channel` turned idle or active: the task's new watermark and
    /// status, where they changed.
    pub fn status(
        &mut self,
        channel: usize,
        status: WatermarkStatus,
    ) -> (Option<i64>, Option<WatermarkStatus>) {
        let last_output = self.last_output;
        let ch = &mut self.channels[channel];
        if ch.finished {
            return (None, None);
        }
        match status {
            WatermarkStatus::Idle if !ch.idle => {
                ch.idle = true;
                ch.aligned = false;
                self.after_channel_left()
            }
            WatermarkStatus::Active if ch.idle => {
                ch.idle = false;
                ch.aligned = ch.watermark >= last_output;
                let status = std::mem::take(&mut self.idle).then_some(WatermarkStatus::Active);
                (None, status)
            }
            _ => (None, None),
        }
    }

    /// `channel` ended: it holds nothing back any more.
    pub fn channel_finished(&mut self, channel: usize) -> (Option<i64>, Option<WatermarkStatus>) {
        let ch = &mut self.channels[channel];
        if ch.finished {
            return (None, None);
        }
        ch.finished = true;
        if self.channels.iter().all(|c| c.finished) {
            return (None, None);
        }
        self.after_channel_left()
    }

    fn after_channel_left(&mut self) -> (Option<i64>, Option<WatermarkStatus>) {
        let live = || self.channels.iter().filter(|c| !c.finished);
        if live().all(|c| c.idle) {
            // Everything is idle: flush what any channel reached.
            let max = live().map(|c| c.watermark).max().unwrap_or(i64::MIN);
            let wm = (max > self.last_output).then(|| {
                self.last_output = max;
                max
            });
            let status =
                (!std::mem::replace(&mut self.idle, true)).then_some(WatermarkStatus::Idle);
            return (wm, status);
        }
        (self.advance(), None)
    }

    fn advance(&mut self) -> Option<i64> {
        let min = self
            .channels
            .iter()
            .filter(|c| !c.idle && c.aligned && !c.finished)
            .map(|c| c.watermark)
            .min()?;
        (min > self.last_output).then(|| {
            self.last_output = min;
            min
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_minimum_of_active_channels_never_goes_backwards() {
        let mut v = StatusWatermarkValve::new(2);
        assert_eq!(v.watermark(0, 5), None, "channel 1 has none yet");
        assert_eq!(v.watermark(1, 3), Some(3));
        assert_eq!(v.watermark(1, 10), Some(5));
        assert_eq!(v.watermark(0, 4), None, "backwards on a channel");
        assert_eq!(v.watermark(0, 12), Some(10));
        assert_eq!(v.current(), 10);
    }

    #[test]
    fn idle_channels_do_not_hold_back_and_all_idle_flushes_the_max() {
        let mut v = StatusWatermarkValve::new(2);
        v.watermark(0, 5);
        v.watermark(1, 3);
        assert_eq!(v.status(1, WatermarkStatus::Idle), (Some(5), None));
        assert_eq!(v.watermark(0, 8), Some(8));
        assert_eq!(
            v.status(0, WatermarkStatus::Idle),
            (None, Some(WatermarkStatus::Idle))
        );
        assert_eq!(
            v.status(1, WatermarkStatus::Active),
            (None, Some(WatermarkStatus::Active))
        );
        // Channel 1 is behind (3 < 8): it counts again once it catches up.
        assert_eq!(v.watermark(1, 6), None);
        assert_eq!(v.watermark(1, 9), Some(9));
    }

    #[test]
    fn an_ended_channel_stops_holding_back() {
        let mut v = StatusWatermarkValve::new(2);
        v.watermark(0, 7);
        v.watermark(1, 2);
        assert_eq!(v.channel_finished(1), (Some(7), None));
        assert_eq!(v.channel_finished(0), (None, None));
    }
}
