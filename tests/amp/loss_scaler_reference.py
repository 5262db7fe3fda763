#!/usr/bin/env python3
"""Independent reference for the Apex and DeepSpeed trajectories pinned in loss_scaler_test.cc.

Restates, with plain Python floats and in the references' own terms (Apex's `unskipped` counter,
DeepSpeed's `cur_iter` / `last_overflow_iter`), the update rules of
  - NVIDIA Apex amp's dynamic LossScaler (apex/amp/scaler.py, as in Apex 25.05, the last release
    with amp): start at min(max_loss_scale, init_scale); overflow: halve (floored at
    min_loss_scale when one is set), unskipped = 0; clean: unskipped += 1; when unskipped equals
    the window: double (capped at max_loss_scale), unskipped = 0;
  - DeepSpeed's DynamicLossScaler.update_scale (deepspeed/runtime/fp16/loss_scaler.py), growth
    checked as in v0.17.1 and later ("since") or as up to v0.17.0 ("before"),
and prints each case's scales after every update and the 1-based updates that grew the scale, as
C++ literals:

    python3 tests/amp/loss_scaler_reference.py

Flags: 'T' = an update with found_inf (overflow), 'F' = a clean update.
"""


class Apex:
    def __init__(self, init_scale=2.0**16, scale_window=2000, min_loss_scale=None,
                 max_loss_scale=2.0**24):
        self.scale = min(max_loss_scale, init_scale)
        self.window = scale_window
        self.min = min_loss_scale
        self.max = max_loss_scale
        self.unskipped = 0

    def update(self, overflow):
        if overflow:
            half = self.scale / 2.0
            self.scale = max(self.min, half) if self.min else half
            self.unskipped = 0
        else:
            self.unskipped += 1
        if self.unskipped == self.window:
            self.scale = min(self.max, self.scale * 2.0)
            self.unskipped = 0


class DeepSpeed:
    def __init__(self, init_scale=2.0**32, scale_factor=2.0, scale_window=1000, min_scale=1.0,
                 delayed_shift=1, consecutive_hysteresis=False, raise_error_at_min_scale=True,
                 growth="since"):
        self.scale = init_scale
        self.factor = scale_factor
        self.window = scale_window
        self.min = min_scale
        self.delayed_shift = delayed_shift
        self.hysteresis = delayed_shift
        self.consecutive = consecutive_hysteresis
        self.raise_at_min = raise_error_at_min_scale
        self.growth = growth
        self.cur_iter = 0
        self.last_overflow_iter = -1

    def grows_now(self):
        since_overflow = self.cur_iter - self.last_overflow_iter
        if self.growth == "before":  # DeepSpeed <= v0.17.0
            return since_overflow % self.window == 0
        stable = since_overflow - 1  # DeepSpeed >= v0.17.1
        return stable > 0 and stable % self.window == 0

    def update(self, overflow):
        if overflow:
            if self.delayed_shift == 1 or self.hysteresis == 1:
                if self.scale == self.min and self.raise_at_min:
                    raise RuntimeError("at minimum")
                self.scale = max(self.scale / self.factor, self.min)
            else:
                self.hysteresis -= 1
            self.last_overflow_iter = self.cur_iter
        else:
            if self.consecutive:
                self.hysteresis = self.delayed_shift
            if self.grows_now():
                if not self.consecutive:
                    self.hysteresis = self.delayed_shift
                self.scale *= self.factor
        self.cur_iter += 1


def run(scaler, flags):
    scales, growths = [], []
    for i, flag in enumerate(flags, start=1):
        before = scaler.scale
        scaler.update(flag == "T")
        if flag == "F" and scaler.scale > before:
            growths.append(i)
        scales.append(scaler.scale)
    return scales, growths


def literal(x):
    return str(int(x)) if x == int(x) and abs(x) < 2**53 else repr(x)


def show(name, scaler, flags):
    initial = scaler.scale
    scales, growths = run(scaler, flags)
    print(f"// {name}: initial {literal(initial)}, flags \"{flags}\"")
    print("//   scales:  {" + ", ".join(literal(s) for s in scales) + "}")
    print("//   growths: {" + ", ".join(str(g) for g in growths) + "}")


def show_changes(name, scaler, flags):
    """For long runs: only the 1-based updates after which the scale changed, and the scale."""
    initial = scaler.scale
    scales, _ = run(scaler, flags)
    previous, changes = initial, []
    for i, scale in enumerate(scales, start=1):
        if scale != previous:
            changes.append(f"{{{i}, {literal(scale)}}}")
        previous = scale
    print(f"// {name}: initial {literal(initial)}, {len(flags)} updates")
    print("//   changes: {" + ", ".join(changes) + "}")


# The engine-vs-class pattern: two overflows, 1001 clean updates (the first growth after an
# overflow at window + 1), then overflow, clean, overflow (hysteresis 2 absorbs the first).
ENGINE_FLAGS = "TT" + "F" * 1001 + "TFT" + "F" * 10

# The fixed overflow pattern of the DeepSpeed old-vs-new test: clean runs of several lengths
# around overflows, one of them a double overflow.
DS_FLAGS = "FFFFFFFTFFFFFFTTFFFFFTFFF"

if __name__ == "__main__":
    show("ApexClampsInitAboveMax", Apex(2.0**30, 2, None, 2.0**24), "FFTFFF")
    show("ApexBacksOffToMin", Apex(1024.0, 3, 100.0), "TTTTTFFFFFF")
    show("ApexWithoutMinHalves", Apex(3.0, 3), "TTTFFF")
    show("ApexGrowsAtTheWindow", Apex(1024.0, 3), "FFFFFFTFFFFFFF")
    for window in (1, 3):
        for growth in ("before", "since"):
            show(f"DeepSpeed window {window} {growth} v0.17.1",
                 DeepSpeed(1024.0, 2.0, window, 1.0, 1, False, True, growth), DS_FLAGS)
    # What DeepSpeed's engine builds from its config defaults (initial_scale_power 16,
    # loss_scale_window 1000, hysteresis 2, min_loss_scale 1) and the class's own defaults.
    show_changes("DeepSpeed engine defaults", DeepSpeed(2.0**16, 2.0, 1000, 1.0, 2), ENGINE_FLAGS)
    show_changes("DeepSpeed class defaults", DeepSpeed(), ENGINE_FLAGS)
    show("DeepSpeed before v0.17.1 hysteresis 2",
         DeepSpeed(1024.0, 2.0, 2, 1.0, 2, False, True, "before"), "TFFTTFFFTTT")
