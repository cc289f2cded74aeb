;; goal: put a hot potato in diningtable.
;; plan: go to countertop 1 | take potato 1 from countertop 1 | go to microwave 1 | heat potato 1 with microwave 1 | go to diningtable 1 | move potato 1 to diningtable 1
;; Hand-written for crl_jax (ALFWorld task type pick_heat_then_place_in_recep) on the ALFRED domain.
(define (problem crl_pick_heat_then_place)
  (:domain alfred)
  (:objects
    agent1 - agent
    loc_bar_start loc_bar_counter loc_bar_microwave loc_bar_table loc_bar_fridge - location
    countertop_bar_1 microwave_bar_1 diningtable_bar_1 fridge_bar_1 - receptacle
    potato_bar_1 egg_bar_1 - object
    PotatoType EggType - otype
    CounterTopType MicrowaveType DiningTableType FridgeType - rtype
  )
  (:init
    (= (total-cost) 0)
    (atLocation agent1 loc_bar_start)
    (receptacleType countertop_bar_1 CounterTopType)
    (receptacleType microwave_bar_1 MicrowaveType)
    (receptacleType diningtable_bar_1 DiningTableType)
    (receptacleType fridge_bar_1 FridgeType)
    (receptacleAtLocation countertop_bar_1 loc_bar_counter)
    (receptacleAtLocation microwave_bar_1 loc_bar_microwave)
    (receptacleAtLocation diningtable_bar_1 loc_bar_table)
    (receptacleAtLocation fridge_bar_1 loc_bar_fridge)
    (openable microwave_bar_1)
    (openable fridge_bar_1)
    (objectType potato_bar_1 PotatoType)
    (objectType egg_bar_1 EggType)
    (pickupable potato_bar_1) (pickupable egg_bar_1)
    (heatable potato_bar_1) (heatable egg_bar_1)
    (coolable potato_bar_1) (coolable egg_bar_1)
    (inReceptacle potato_bar_1 countertop_bar_1)
    (objectAtLocation potato_bar_1 loc_bar_counter)
    (inReceptacle egg_bar_1 fridge_bar_1)
    (objectAtLocation egg_bar_1 loc_bar_fridge)
    (canContain DiningTableType PotatoType) (canContain DiningTableType EggType)
    (canContain CounterTopType PotatoType) (canContain CounterTopType EggType)
    (canContain FridgeType PotatoType) (canContain FridgeType EggType)
    (canContain MicrowaveType PotatoType) (canContain MicrowaveType EggType)
  )
  (:goal (exists (?o - object) (and (objectType ?o PotatoType) (isHot ?o) (inReceptacle ?o diningtable_bar_1))))
)
