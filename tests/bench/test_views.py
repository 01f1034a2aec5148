import gc

from django.test import override_settings


class _Cycle:
    def __init__(self) -> None:
        self.me = self


@override_settings(ROOT_URLCONF="bench.urls")
def test_the_next_measurement_starts_without_the_garbage_of_the_one_before(client):
    gc.collect()
    gc.disable()  # as if no automatic collection came before the next measurement
    try:
        for _ in range(100):
            _Cycle()  # unreachable, freed only by a collection
        response = client.post("/bench/collect")
    finally:
        gc.enable()
    assert response.status_code == 200
    assert response.json()["freed"] >= 100
    assert not [o for o in gc.get_objects() if isinstance(o, _Cycle)]
