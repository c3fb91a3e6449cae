//! The watchers of a run's completions: fio's steady-state detection
//! ([`super::super::steady`]) and latency-target search ([`super::super::latency`]), as
//! they start and stop a [`FioSource`]'s clones.

use super::FioSource;

impl FioSource {
    /// A read or write of `sid` completed at `now` after `latency_ms`: its latency-target
    /// search's step.
    pub(super) fn lat_completed(&mut self, sid: u32, latency_ms: f64, now: f64) {
        use super::super::latency::Step;
        let Some(s) = self.streams.get_mut(sid as usize) else {
            return;
        };
        let (Some(search), false) = (s.lat.as_mut(), s.done) else {
            return;
        };
        let job = &self.jobs[s.job];
        match search.completed(&job.extra.lat, latency_ms, now, s.quiesce.is_some()) {
            Step::Go => {}
            Step::Quiesce { reset } => s.quiesce = Some(reset),
            Step::End { fatal } => {
                if fatal {
                    tracing::warn!(
                        "job '{}': an I/O took {latency_ms:.3} ms at queue depth 1, over latency_target: fio ends the job (max latency exceeded)",
                        job.name
                    );
                }
                self.stop_stream(sid, now);
            }
        }
    }

    /// Whether clone `sid`, one of its requests having completed at `now`, issues another
    /// (its latency-target search's depth, and its wait for the I/O in flight); a depth
    /// raised by the search gets its further requests here.
    pub(super) fn lat_may_issue(&mut self, sid: u32, now: f64) -> bool {
        let Some(s) = self.streams.get_mut(sid as usize) else {
            return true;
        };
        let (Some(search), false) = (s.lat.as_mut(), s.done) else {
            return true;
        };
        if let Some(reset) = s.quiesce {
            if s.in_flight > 0 {
                return false;
            }
            s.quiesce = None;
            search.new_cycle(now);
            if reset {
                if let Ok(mut r) = self.resets.lock() {
                    r[s.job] = Some(now);
                }
            }
        }
        // (requests of a raised depth not handed out yet count as in flight)
        let queued: u64 = self
            .initial
            .iter()
            .filter(|e| e.0 == sid)
            .map(|e| e.1)
            .sum();
        let busy = s.in_flight + queued;
        // (a synchronous engine keeps one in flight whatever the search's depth)
        let depth = search.qd.min(self.jobs[s.job].effective_depth());
        if busy >= depth {
            return false;
        }
        let more = depth - busy - 1;
        if more > 0 {
            self.initial.push_back((sid, more, now));
        }
        true
    }

    /// fio's steady-state ticks up to `now`, then the completion of a request of `sid`
    /// (`bytes`, None: no data I/O); the clones whose unit held steady stop.
    pub(super) fn steady_completed(&mut self, sid: u32, bytes: Option<u64>, now: f64) {
        let Some(mut m) = self.steady.take() else {
            return;
        };
        let running = |s: u32| {
            let st = self.streams.get(s as usize)?;
            (self.started[st.job] && st.in_flight != u64::MAX).then_some(st.start)
        };
        let stop = m.ticks_until(self.start, now, &running);
        m.completed(sid, bytes);
        self.steady = Some(m);
        for (s, _tick) in stop {
            self.stop_stream(s, now);
        }
    }
}
