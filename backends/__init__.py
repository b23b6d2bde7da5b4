"""Built-in backends. Each subpackage exposes `backend`, registered in the "hal.backends" entry-point
group; hal/ finds them only through that group."""
