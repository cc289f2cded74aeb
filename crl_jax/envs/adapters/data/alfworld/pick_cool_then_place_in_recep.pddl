;; goal: put a cool tomato in countertop.
;; plan: go to diningtable 1 | take tomato 1 from diningtable 1 | go to fridge 1 | cool tomato 1 with fridge 1 | go to countertop 1 | move tomato 1 to countertop 1
;; Hand-written for crl_jax (ALFWorld task type pick_cool_then_place_in_recep) on the ALFRED domain.
(define (problem crl_pick_cool_then_place)
  (:domain alfred)
  (:objects
    agent1 - agent
    loc_bar_start loc_bar_table loc_bar_fridge loc_bar_counter loc_bar_shelf - location
    diningtable_bar_1 fridge_bar_1 countertop_bar_1 shelf_bar_1 - receptacle
    tomato_bar_1 lettuce_bar_1 - object
    TomatoType LettuceType - otype
    DiningTableType FridgeType CounterTopType ShelfType - rtype
  )
  (:init
    (= (total-cost) 0)
    (atLocation agent1 loc_bar_start)
    (receptacleType diningtable_bar_1 DiningTableType)
    (receptacleType fridge_bar_1 FridgeType)
    (receptacleType countertop_bar_1 CounterTopType)
    (receptacleType shelf_bar_1 ShelfType)
    (receptacleAtLocation diningtable_bar_1 loc_bar_table)
    (receptacleAtLocation fridge_bar_1 loc_bar_fridge)
    (receptacleAtLocation countertop_bar_1 loc_bar_counter)
    (receptacleAtLocation shelf_bar_1 loc_bar_shelf)
    (openable fridge_bar_1)
    (objectType tomato_bar_1 TomatoType)
    (objectType lettuce_bar_1 LettuceType)
    (pickupable tomato_bar_1) (pickupable lettuce_bar_1)
    (coolable tomato_bar_1) (coolable lettuce_bar_1)
    (inReceptacle tomato_bar_1 diningtable_bar_1)
    (objectAtLocation tomato_bar_1 loc_bar_table)
    (inReceptacle lettuce_bar_1 shelf_bar_1)
    (objectAtLocation lettuce_bar_1 loc_bar_shelf)
    (canContain CounterTopType TomatoType) (canContain CounterTopType LettuceType)
    (canContain DiningTableType TomatoType) (canContain DiningTableType LettuceType)
    (canContain FridgeType TomatoType) (canContain FridgeType LettuceType)
    (canContain ShelfType TomatoType) (canContain ShelfType LettuceType)
  )
  (:goal (exists (?o - object) (and (objectType ?o TomatoType) (isCool ?o) (inReceptacle ?o countertop_bar_1))))
)
