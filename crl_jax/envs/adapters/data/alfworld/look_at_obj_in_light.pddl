;; goal: look at book under the desklamp.
;; plan: go to desk 1 | take book 1 from desk 1 | go to sidetable 1 | use desklamp 1
;; Hand-written for crl_jax (ALFWorld task type look_at_obj_in_light) on the ALFRED domain.
(define (problem crl_look_at_obj_in_light)
  (:domain alfred)
  (:objects
    agent1 - agent
    loc_bar_start loc_bar_desk loc_bar_sidetable loc_bar_bed loc_bar_drawer - location
    desk_bar_1 sidetable_bar_1 bed_bar_1 drawer_bar_1 - receptacle
    book_bar_1 desklamp_bar_1 pillow_bar_1 pen_bar_1 - object
    BookType DeskLampType PillowType PenType - otype
    DeskType SideTableType BedType DrawerType - rtype
  )
  (:init
    (= (total-cost) 0)
    (atLocation agent1 loc_bar_start)
    (receptacleType desk_bar_1 DeskType)
    (receptacleType sidetable_bar_1 SideTableType)
    (receptacleType bed_bar_1 BedType)
    (receptacleType drawer_bar_1 DrawerType)
    (receptacleAtLocation desk_bar_1 loc_bar_desk)
    (receptacleAtLocation sidetable_bar_1 loc_bar_sidetable)
    (receptacleAtLocation bed_bar_1 loc_bar_bed)
    (receptacleAtLocation drawer_bar_1 loc_bar_drawer)
    (openable drawer_bar_1)
    (objectType book_bar_1 BookType)
    (objectType desklamp_bar_1 DeskLampType)
    (objectType pillow_bar_1 PillowType)
    (objectType pen_bar_1 PenType)
    (pickupable book_bar_1) (pickupable pillow_bar_1) (pickupable pen_bar_1)
    (toggleable desklamp_bar_1)
    (inReceptacle book_bar_1 desk_bar_1)
    (objectAtLocation book_bar_1 loc_bar_desk)
    (inReceptacle desklamp_bar_1 sidetable_bar_1)
    (objectAtLocation desklamp_bar_1 loc_bar_sidetable)
    (inReceptacle pillow_bar_1 bed_bar_1)
    (objectAtLocation pillow_bar_1 loc_bar_bed)
    (inReceptacle pen_bar_1 drawer_bar_1)
    (objectAtLocation pen_bar_1 loc_bar_drawer)
    (canContain DeskType BookType) (canContain DeskType PenType) (canContain DeskType PillowType)
    (canContain SideTableType BookType) (canContain SideTableType PenType)
    (canContain BedType BookType) (canContain BedType PillowType)
    (canContain DrawerType BookType) (canContain DrawerType PenType)
  )
  (:goal (and (exists (?o - object) (and (objectType ?o BookType) (holds agent1 ?o)))
              (exists (?t - object) (and (objectType ?t DeskLampType) (isToggled ?t)))))
)
