"""StalenessLogger: the protocol's counters as epoch metrics of `fit`."""

import tf_keras

# The keys StalenessLogger adds to each epoch's logs.
LOGGED_KEYS = ("updates", "gradients", "dropped", "staleness_mean",
               "staleness_max")


class StalenessLogger(tf_keras.callbacks.Callback):
  """Adds each epoch's updates, gradients and staleness to the epoch logs.

  Under a RudraStrategy, at the end of every epoch of `fit` it adds, for the
  gradients the parameter server received during that epoch (first shard):

  * "updates": updates applied;
  * "gradients": gradients received (accepted and dropped);
  * "dropped": gradients refused by `max_staleness`;
  * "staleness_mean", "staleness_max": their mean and largest staleness σ.

  fit's own epoch lines (`verbose=2`, the default under a parameter-server
  strategy) and the History then show them, and so does every callback
  listed after this one (CSVLogger, TensorBoard, EarlyStopping on
  "staleness_mean", ...):

      model.fit(dataset, epochs=3, steps_per_epoch=100, callbacks=[
          rudra_tf.StalenessLogger(), tf_keras.callbacks.CSVLogger("log.csv")])

  The whole run's counters and histogram: `strategy.staleness_report()`.
  Reading them costs one small RPC per shard at each epoch's start and end.
  """

  def __init__(self):
    super().__init__()
    self._epoch_start_report = None

  def _strategy(self):
    from rudra_tf.strategy import RudraStrategy  # pylint: disable=g-import-not-at-top
    strategy = self.model.distribute_strategy
    if not isinstance(strategy, RudraStrategy):
      raise ValueError(
          "StalenessLogger reports a RudraStrategy's counters; this model "
          f"was built under {type(strategy).__name__}.")
    return strategy

  def on_epoch_begin(self, epoch, logs=None):
    self._epoch_start_report = self._strategy().staleness_report()

  def on_epoch_end(self, epoch, logs=None):
    if logs is None or self._epoch_start_report is None:
      return
    counted = self._strategy().staleness_report().since(
        self._epoch_start_report)
    logs.update({key: counted[key] for key in LOGGED_KEYS})
