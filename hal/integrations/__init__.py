"""Adapters that let inference engines and model libraries run their MoE layers through moe-hal.
Each adapter imports its library lazily, so `import hal` never needs them."""
