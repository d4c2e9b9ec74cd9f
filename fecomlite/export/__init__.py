"""A stored run in the formats other tools read: a Perfetto / chrome://tracing timeline
(`perfetto.trace`) and OpenMetrics text of its summary (`openmetrics.text`)."""
