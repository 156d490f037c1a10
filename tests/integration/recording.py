"""A rollout engine wrapper that records each request and what was sampled for it (keyed by its stream)."""


class Recording:
    """The rollout worker's engine, recording every request it is given and what it sampled for it."""

    def __init__(self, engine):
        self.engine, self.requests, self.sampled = engine, {}, {}
        self.abilities = engine.abilities

    @property
    def version(self):
        return self.engine.version

    @property
    def busy(self):
        return self.engine.busy

    def admit(self, requests):
        self.requests.update(requests)
        self.engine.admit(requests)

    def tick(self, version):
        done = self.engine.tick(version)
        for rid, c in done:
            q = self.requests[rid]
            self.sampled[q.stream] = (list(q.prompt_ids), c.ids, c.log_probs)
        return done

    def end_rollout(self):
        self.engine.end_rollout()
