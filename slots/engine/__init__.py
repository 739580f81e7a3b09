"""The engine, composed of parts: `Engine` (engine.py: the API and the thread), the loaded
model (`Loaded`, loaded.py), the step (`Stepper`, stepper.py), the admission of waiting
requests (`Admitter`, admitter.py) and what the engine knows about demand (`EngineDemand`,
demand.py). See engine.py's docstring."""

from .engine import Engine
from ..settings import EngineConfig

__all__ = ["Engine", "EngineConfig"]
