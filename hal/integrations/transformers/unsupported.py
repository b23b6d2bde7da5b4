"""The one exception of the transformers adapter: a layer moe-hal cannot serve, with the reason that
the layer logs before it runs the module's eager forward instead."""


class Unsupported(Exception):
    @property
    def reason(self) -> str:
        return str(self.args[0]) if self.args else "unsupported"
