;; goal: put an apple in fridge.
;; plan: go to countertop 1 | take apple 1 from countertop 1 | go to fridge 1 | open fridge 1 | move apple 1 to fridge 1
;; Hand-written for crl_jax (ALFWorld task type pick_and_place_simple) on the ALFRED domain.
(define (problem crl_pick_and_place_simple)
  (:domain alfred)
  (:objects
    agent1 - agent
    loc_bar_start loc_bar_counter loc_bar_fridge loc_bar_table loc_bar_cabinet - location
    countertop_bar_1 fridge_bar_1 diningtable_bar_1 cabinet_bar_1 - receptacle
    apple_bar_1 mug_bar_1 bread_bar_1 - object
    AppleType MugType BreadType - otype
    CounterTopType FridgeType DiningTableType CabinetType - rtype
  )
  (:init
    (= (total-cost) 0)
    (atLocation agent1 loc_bar_start)
    (receptacleType countertop_bar_1 CounterTopType)
    (receptacleType fridge_bar_1 FridgeType)
    (receptacleType diningtable_bar_1 DiningTableType)
    (receptacleType cabinet_bar_1 CabinetType)
    (receptacleAtLocation countertop_bar_1 loc_bar_counter)
    (receptacleAtLocation fridge_bar_1 loc_bar_fridge)
    (receptacleAtLocation diningtable_bar_1 loc_bar_table)
    (receptacleAtLocation cabinet_bar_1 loc_bar_cabinet)
    (openable fridge_bar_1)
    (openable cabinet_bar_1)
    (objectType apple_bar_1 AppleType)
    (objectType mug_bar_1 MugType)
    (objectType bread_bar_1 BreadType)
    (pickupable apple_bar_1)
    (pickupable mug_bar_1)
    (pickupable bread_bar_1)
    (inReceptacle apple_bar_1 countertop_bar_1)
    (objectAtLocation apple_bar_1 loc_bar_counter)
    (inReceptacle mug_bar_1 diningtable_bar_1)
    (objectAtLocation mug_bar_1 loc_bar_table)
    (inReceptacle bread_bar_1 cabinet_bar_1)
    (objectAtLocation bread_bar_1 loc_bar_cabinet)
    (canContain FridgeType AppleType) (canContain FridgeType BreadType) (canContain FridgeType MugType)
    (canContain CounterTopType AppleType) (canContain CounterTopType MugType) (canContain CounterTopType BreadType)
    (canContain DiningTableType AppleType) (canContain DiningTableType MugType) (canContain DiningTableType BreadType)
    (canContain CabinetType MugType) (canContain CabinetType BreadType)
  )
  (:goal (exists (?o - object) (and (objectType ?o AppleType) (inReceptacle ?o fridge_bar_1))))
)
