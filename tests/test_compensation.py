"""Golden values of compensation.py's rules, worked by hand in comments."""

import numpy as np
import pytest
import tensorflow as tf

from rudra_tf import compensation

# The module docstring's example: θ_now − θ_pulled = [0.2, −0.5], g ⊙ g =
# [1, 4].
GRADIENT = np.array([1.0, -2.0])
CURRENT = np.array([0.5, 1.0])
PULLED = np.array([0.3, 1.5])


def test_delay_compensation_golden_values():
  # g + 0.1 · [1 · 0.2, 4 · (−0.5)] = [1 + 0.02, −2 − 0.2].
  np.testing.assert_allclose(
      compensation.delay_compensated(GRADIENT, CURRENT, PULLED, 0.1),
      [1.02, -2.2])


def test_delay_compensation_leaves_a_fresh_gradient_and_zero_strength_alone():
  np.testing.assert_allclose(
      compensation.delay_compensated(GRADIENT, CURRENT, CURRENT, 0.1),
      GRADIENT)
  np.testing.assert_allclose(
      compensation.delay_compensated(GRADIENT, CURRENT, PULLED, 0.0),
      GRADIENT)


def test_adaptive_delay_compensation_golden_values():
  # ms = 0.95 · 0 + 0.05 · [1, 4] = [0.05, 0.2];
  # λ = 0.1 / sqrt(ms) = [0.1 / 0.223607, 0.1 / 0.447214] = [0.447214, 0.223607];
  # g_dc = [1 + 0.447214 · 1 · 0.2, −2 + 0.223607 · 4 · (−0.5)]
  #      = [1.089443, −2.447214].
  mean_square = compensation.updated_mean_square(
      np.zeros(2), GRADIENT, compensation.DC_MEAN_SQUARE_DECAY)
  np.testing.assert_allclose(mean_square, [0.05, 0.2])
  strength = compensation.adaptive_strength(0.1, mean_square)
  np.testing.assert_allclose(strength, [0.447214, 0.223607], rtol=1e-5)
  np.testing.assert_allclose(
      compensation.delay_compensated(GRADIENT, CURRENT, PULLED, strength),
      [1.089443, -2.447214], rtol=1e-5)


def test_gap_aware_golden_values_at_the_first_gradient():
  # v = 0.001 · [1, 4]; t = 1: v̂ = v / (1 − 0.999) = [1, 4];
  # C = 0.1 · ([1, 2] + ε) = [0.1, 0.2];
  # G = 1 + [0.2 / 0.1, 0.5 / 0.2] = [3, 3.5]; g / G = [1/3, −2/3.5].
  mean_square = compensation.updated_mean_square(
      np.zeros(2), GRADIENT, compensation.GAP_MEAN_SQUARE_DECAY)
  step = compensation.typical_step(mean_square, 1, 0.1)
  np.testing.assert_allclose(step, [0.1, 0.2], rtol=1e-5)
  np.testing.assert_allclose(compensation.gap(CURRENT, PULLED, step),
                             [3.0, 3.5], rtol=1e-5)
  np.testing.assert_allclose(
      compensation.gap_aware(GRADIENT, CURRENT, PULLED, step),
      [1 / 3, -2 / 3.5], rtol=1e-5)


def test_gap_aware_bias_correction_over_two_gradients():
  # g1 = [1, −2], then g2 = [3, 0] with β = 0.5 (to keep the numbers small):
  # v1 = 0.5 · [1, 4] = [0.5, 2]; v2 = 0.5 · v1 + 0.5 · [9, 0] = [4.75, 1];
  # v̂ = v2 / (1 − 0.25) = [6.3333, 1.3333]; sqrt = [2.51661, 1.154701];
  # C = 0.1 · sqrt = [0.251661, 0.1154701].
  mean_square = compensation.updated_mean_square(np.zeros(2), GRADIENT, 0.5)
  mean_square = compensation.updated_mean_square(
      mean_square, np.array([3.0, 0.0]), 0.5)
  np.testing.assert_allclose(mean_square, [4.75, 1.0])
  np.testing.assert_allclose(
      compensation.typical_step(mean_square, 2, 0.1, decay=0.5),
      [0.251661, 0.1154701], rtol=1e-5)


def test_a_fresh_gradient_has_gap_one_and_goes_through():
  step = np.array([0.1, 0.2])
  np.testing.assert_allclose(compensation.gap(CURRENT, CURRENT, step), [1, 1])
  np.testing.assert_allclose(
      compensation.gap_aware(GRADIENT, CURRENT, CURRENT, step), GRADIENT)


def test_the_rules_run_on_tensors_in_a_graph():
  ops = compensation.Ops(tf.sqrt, tf.abs)

  @tf.function
  def rules(gradient, current, pulled):
    mean_square = compensation.updated_mean_square(
        tf.zeros_like(gradient), gradient, compensation.GAP_MEAN_SQUARE_DECAY)
    step = compensation.typical_step(mean_square, 1, 0.1, ops=ops)
    strength = compensation.adaptive_strength(0.1, 0.05 * gradient * gradient,
                                              ops=ops)
    return (compensation.gap_aware(gradient, current, pulled, step, ops),
            compensation.delay_compensated(gradient, current, pulled,
                                           strength))

  gap_aware, compensated = rules(*(tf.constant(a) for a in
                                   (GRADIENT, CURRENT, PULLED)))
  np.testing.assert_allclose(gap_aware.numpy(), [1 / 3, -2 / 3.5], rtol=1e-5)
  np.testing.assert_allclose(compensated.numpy(), [1.089443, -2.447214],
                             rtol=1e-5)


@pytest.mark.parametrize("decay", [-0.1, 1.0, 1.5])
def test_a_bad_decay_names_the_value_and_the_valid_range(decay):
  with pytest.raises(ValueError, match=rf"decay must be in \[0, 1\), got "
                     rf"{decay}"):
    compensation.updated_mean_square(np.zeros(2), GRADIENT, decay)
  with pytest.raises(ValueError, match=r"decay must be in \[0, 1\)"):
    compensation.typical_step(np.ones(2), 1, 0.1, decay=decay)


def test_typical_step_refuses_no_gradients_averaged():
  with pytest.raises(ValueError, match="gradients_averaged must be >= 1.*0"):
    compensation.typical_step(np.ones(2), 0, 0.1)


def test_a_rule_by_name_over_two_gradients_the_docstring_trajectory():
  # gap_aware, α = 0.1, θ_now − θ_pulled = 0.2, g = 1 then 3 (module
  # docstring): g_ga = 1/3, then 3 / (1 + 0.2 / (0.1 · sqrt(0.009999 /
  # 0.001999))) = 3 / 1.8943 = 1.5837; t counts the gradients.
  rule = compensation.Compensation.create("gap_aware")
  first, mean_square, count = rule.correct(1.0, 0.5, 0.3, 0.0, 0, 0.1)
  second, mean_square, count = rule.correct(3.0, 0.5, 0.3, mean_square,
                                            count, 0.1)
  assert first == pytest.approx(1 / 3, rel=1e-6)
  assert second == pytest.approx(1.5837, abs=1e-4)
  assert (mean_square, count) == (pytest.approx(0.009999), 2)


def test_each_rule_by_name_matches_its_function():
  # "none" and "delay" keep no state; the adaptive rule updates ms first.
  none = compensation.Compensation.create()
  assert not none.enabled
  assert none.correct(GRADIENT, CURRENT, PULLED)[0] is GRADIENT
  delay = compensation.Compensation.create("delay", 0.1)
  corrected, mean_square, count = delay.correct(GRADIENT, CURRENT, PULLED)
  np.testing.assert_allclose(corrected, [1.02, -2.2])
  assert (mean_square, count) == (0.0, 0)
  adaptive = compensation.Compensation.create("delay_adaptive", 0.1)
  corrected, mean_square, count = adaptive.correct(GRADIENT, CURRENT, PULLED,
                                                   np.zeros(2), 0)
  np.testing.assert_allclose(corrected, [1.089443, -2.447214], rtol=1e-6)
  np.testing.assert_allclose(mean_square, [0.05, 0.2])
  assert count == 1
  assert compensation.Compensation.create("delay").strength == 0.04
  assert compensation.Compensation.create("delay_adaptive").strength == 2.0


@pytest.mark.parametrize("name,strength,fragment", [
    ("dc", None, "Unknown compensation 'dc'; valid values are 'none', "
     "'delay', 'delay_adaptive', 'gap_aware'"),
    ("delay", -0.1, "must be a number >= 0, got -0.1"),
    ("delay", "big", "must be a number >= 0, got 'big'"),
    ("gap_aware", 0.5, "compensation 'gap_aware' takes no strength"),
    ("none", 1.0, "compensation 'none' takes no strength"),
])
def test_bad_rules_name_the_value_and_the_valid_ones(name, strength,
                                                     fragment):
  with pytest.raises(ValueError) as error:
    compensation.Compensation.create(name, strength)
  assert fragment in str(error.value)
