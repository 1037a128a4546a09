r"""Corrections of a stale gradient by how far the weights moved since its pull.

Rudra weighs a stale gradient by the number of updates it missed (σ,
protocol.py). Two later rules look at the weights instead. Both need θ_pulled,
the weights the learner computed the gradient g on, beside θ_now, the
parameter server's weights when g arrives; all products below are
element-wise (⊙), per parameter.

* Delay compensation (DC-ASGD; Zheng et al., "Asynchronous Stochastic
  Gradient Descent with Delay Compensation", arXiv 1609.08326). The gradient
  at θ_now, to first order, with g ⊙ g standing in for the Hessian's
  diagonal:

      g_dc = g + λ_dc · g ⊙ g ⊙ (θ_now − θ_pulled)

  The paper's adaptive variant (DC-ASGD-a) scales λ_dc per parameter by a
  moving average of g ⊙ g, updated with this gradient first:

      ms     ← m · ms + (1 − m) · g ⊙ g          (m = 0.95 in the paper)
      λ_dc,i = λ0 / sqrt(ms_i + ε)

* Gap-aware (Barkai, Hakimi, Schuster, "Gap-Aware Mitigation of Gradient
  Staleness", arXiv 1909.10802). The gap is the distance the weights moved,
  in units of one typical update of that parameter, C; the gradient is
  divided by one plus it:

      v ← β · v + (1 − β) · g ⊙ g,   v̂ = v / (1 − β^t)   (β = 0.999; t: the
                                                        gradients averaged)
      C = α · (sqrt(v̂) + ε)          (α: the step size, the schedule's largest)
      G = 1 + |θ_now − θ_pulled| / C
      g_ga = g / G

  A fresh gradient (θ_pulled = θ_now) has G = 1 and goes through as it is;
  one whose weights moved k typical steps is divided by about 1 + k: like
  Rudra's 1/σ, but per parameter and by distance rather than by count.

Worked values (the golden values of tests/test_compensation.py): g = [1, −2],
θ_now = [0.5, 1.0], θ_pulled = [0.3, 1.5], so θ_now − θ_pulled = [0.2, −0.5]
and g ⊙ g = [1, 4]:

    delay_compensated, λ_dc = 0.1:   g + 0.1 · [1 · 0.2, 4 · (−0.5)]
                                     = [1.02, −2.2]
    adaptive, λ0 = 0.1, ms = 0:      ms = 0.05 · [1, 4] = [0.05, 0.2],
                                     λ_dc = 0.1 / sqrt(ms) = [0.4472, 0.2236],
                                     g_dc = [1 + 0.4472 · 0.2, −2 − 0.2236 · 2]
                                          = [1.0894, −2.4472]
    gap_aware, α = 0.1, first gradient (t = 1, v̂ = g ⊙ g):
                                     C = 0.1 · [1, 2] = [0.1, 0.2],
                                     G = 1 + [0.2 / 0.1, 0.5 / 0.2] = [3, 3.5],
                                     g_ga = [1 / 3, −2 / 3.5] = [0.3333, −0.5714]

Nothing here touches TensorFlow's runtime: a caller passes `ops` (sqrt and
abs for its kind of numbers), as with transition.py, so the parameter server
and the simulator can share each rule.

`Compensation` is a rule by name, as `StalenessAwareOptimizer(...,
compensation=...)`, the simulator and launch.train's --compensation take it:

    "none"            g as it is (Rudra's lr_policy alone weighs it)
    "delay"           DC-ASGD, constant λ_dc (`strength`, default 0.04:
                      MXNet's DCASGD default)
    "delay_adaptive"  DC-ASGD-a, λ_dc = λ0 / sqrt(ms + ε) (`strength` λ0,
                      default 2.0)
    "gap_aware"       g / G (no strength)

Its `correct` takes one gradient and the state the rule keeps per parameter
(ms or v, and t) and returns the corrected gradient with the state after it:
two gradients in a row, worked (gap_aware, α = 0.1, one parameter, θ_now −
θ_pulled = 0.2 for both, g = 1 then g = 3):

    t = 1: v = 0.001 · 1 = 0.001,  v̂ = 1,  C = 0.1,  G = 1 + 0.2/0.1 = 3,
           g_ga = 1/3
    t = 2: v = 0.999 · 0.001 + 0.001 · 9 = 0.009999,  v̂ = v / (1 − 0.999²)
           = 0.009999 / 0.001999 = 5.002,  C = 0.1 · 2.2365 = 0.22365,
           G = 1 + 0.2 / 0.22365 = 1.8943,  g_ga = 3 / 1.8943 = 1.5837
"""

import dataclasses
import typing

import numpy as np

# DC-ASGD-a's moving-average factor for g ⊙ g (the paper's m).
DC_MEAN_SQUARE_DECAY = 0.95
# Gap-aware's moving-average factor for g ⊙ g (the paper's β): long, so that
# C is the size of a typical step, not of the last one.
GAP_MEAN_SQUARE_DECAY = 0.999
# Keeps the square roots' divisions finite where a parameter's gradients
# have all been zero.
EPSILON = 1e-7


class Ops(typing.NamedTuple):
  """The operations the rules need, for numbers or for tensors."""
  sqrt: typing.Callable
  abs: typing.Callable


NUMPY_OPS = Ops(np.sqrt, np.abs)


def _check_decay(decay):
  if not 0 <= decay < 1:
    raise ValueError(f"decay must be in [0, 1), got {decay!r}.")


def delay_compensated(gradient, current, pulled, strength):
  """g + λ_dc · g ⊙ g ⊙ (θ_now − θ_pulled) (module docstring).

  `strength` is λ_dc: a number, or a per-parameter array (the adaptive
  variant's, from `adaptive_strength`). λ_dc = 0 gives g back.
  """
  return gradient + strength * gradient * gradient * (current - pulled)


def updated_mean_square(mean_square, gradient, decay):
  """m · ms + (1 − m) · g ⊙ g: a moving average of the squared gradient."""
  _check_decay(decay)
  return decay * mean_square + (1 - decay) * gradient * gradient


def adaptive_strength(base_strength, mean_square, epsilon=EPSILON,
                      ops=NUMPY_OPS):
  """DC-ASGD-a's per-parameter λ_dc = λ0 / sqrt(ms + ε), `mean_square`
  already updated with this gradient (`updated_mean_square`)."""
  return base_strength / ops.sqrt(mean_square + epsilon)


def typical_step(mean_square, gradients_averaged, step_size,
                 decay=GAP_MEAN_SQUARE_DECAY, epsilon=EPSILON, ops=NUMPY_OPS):
  """Gap-aware's C = α · (sqrt(v̂) + ε), v̂ = v / (1 − β^t): the size of one
  typical update of each parameter.

  Args:
    mean_square: v, the moving average of g ⊙ g (`updated_mean_square` with
      `decay`), already updated with this gradient.
    gradients_averaged: t >= 1, the gradients v has averaged (the bias
      correction: v starts at 0).
    step_size: α, the learning rate's largest value.
  """
  _check_decay(decay)
  if isinstance(gradients_averaged, (int, float)) and gradients_averaged < 1:
    raise ValueError("gradients_averaged must be >= 1 (v is updated with "
                     f"this gradient first), got {gradients_averaged!r}.")
  corrected = mean_square / (1 - decay ** gradients_averaged)
  return step_size * (ops.sqrt(corrected) + epsilon)


def gap(current, pulled, step, ops=NUMPY_OPS):
  """G = 1 + |θ_now − θ_pulled| / C, per parameter (C: `typical_step`)."""
  return 1 + ops.abs(current - pulled) / step


def gap_aware(gradient, current, pulled, step, ops=NUMPY_OPS):
  """g / G: the gradient divided by its gap (module docstring)."""
  return gradient / gap(current, pulled, step, ops)


NONE = "none"
DELAY = "delay"
DELAY_ADAPTIVE = "delay_adaptive"
GAP_AWARE = "gap_aware"
COMPENSATIONS = (NONE, DELAY, DELAY_ADAPTIVE, GAP_AWARE)
# λ_dc for "delay" (MXNet's DCASGD default) and λ0 for "delay_adaptive": a
# starting point, to be tuned per model as the learning rate is.
DEFAULT_STRENGTH = {DELAY: 0.04, DELAY_ADAPTIVE: 2.0}


@dataclasses.dataclass(frozen=True)
class Compensation:
  """A correction rule by name (module docstring), with its strength."""
  name: str = NONE
  strength: typing.Optional[float] = None

  @classmethod
  def create(cls, name=NONE, strength=None):
    """The rule `name` (one of COMPENSATIONS); `strength` None takes the
    rule's default. ValueError names a bad value and the valid ones."""
    if name is None:
      name = NONE
    if name not in COMPENSATIONS:
      raise ValueError(
          f"Unknown compensation {name!r}; valid values are "
          f"{', '.join(repr(c) for c in COMPENSATIONS)}.")
    if name not in DEFAULT_STRENGTH:
      if strength is not None:
        raise ValueError(
            f"compensation {name!r} takes no strength (got {strength!r}); "
            f"only {', '.join(repr(c) for c in DEFAULT_STRENGTH)} do.")
      return cls(name, None)
    if strength is None:
      strength = DEFAULT_STRENGTH[name]
    if isinstance(strength, bool) or not isinstance(strength, (int, float)) \
        or not strength >= 0:
      raise ValueError(f"compensation strength must be a number >= 0, got "
                       f"{strength!r}.")
    return cls(name, float(strength))

  @property
  def enabled(self):
    """Whether the rule needs θ_pulled (every rule but "none")."""
    return self.name != NONE

  @property
  def keeps_mean_square(self):
    """Whether the rule keeps a moving average of g ⊙ g per parameter."""
    return self.name in (DELAY_ADAPTIVE, GAP_AWARE)

  @property
  def decay(self):
    return (GAP_MEAN_SQUARE_DECAY if self.name == GAP_AWARE
            else DC_MEAN_SQUARE_DECAY)

  def correct(self, gradient, current, pulled, mean_square=0.0, count=0,
              step_size=None, ops=NUMPY_OPS):
    """One accepted gradient, corrected.

    Args:
      gradient, current, pulled: g, θ_now, θ_pulled (arrays or tensors).
      mean_square, count: the rule's state before g (ms or v, and t: the
        gradients it has averaged); ignored by "none" and "delay".
      step_size: α, for "gap_aware".

    Returns:
      (corrected gradient, mean_square after, count after).
    """
    if self.name == NONE:
      return gradient, mean_square, count
    if self.name == DELAY:
      return (delay_compensated(gradient, current, pulled, self.strength),
              mean_square, count)
    mean_square = updated_mean_square(mean_square, gradient, self.decay)
    count = count + 1
    if self.name == DELAY_ADAPTIVE:
      strength = adaptive_strength(self.strength, mean_square, ops=ops)
      return (delay_compensated(gradient, current, pulled, strength),
              mean_square, count)
    if step_size is None:
      raise ValueError("gap_aware needs the step size α.")
    step = typical_step(mean_square, count, step_size, self.decay, ops=ops)
    return gap_aware(gradient, current, pulled, step, ops), mean_square, count

  def get_config(self):
    return {"compensation": self.name, "compensation_strength": self.strength}
