"""The asynchronous pipeline: TrainQueue with bounded policy lag, controller, baseline modes."""
